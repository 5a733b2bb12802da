// See ledger.h. One line per test: "RAN Suite.Name", "SKIPPED Suite.Name\treason",
// "FILTERED Suite.Name" (not selected by this entry's --gtest_filter).
#include "tests/ledger.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace meshtrain::test {
namespace {

std::string one_line(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\t') c = ' ';
  return s;
}

class LedgerListener : public ::testing::EmptyTestEventListener {
 public:
  explicit LedgerListener(std::string path) : path_(std::move(path)) {}

  void OnTestProgramEnd(const ::testing::UnitTest& unit) override {
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(path_).parent_path(), ec);
    std::ofstream out(path_ + ".tmp");
    if (!out) {
      std::fprintf(stderr, "cannot write the test ledger %s.tmp (MESHTRAIN_TEST_LEDGER)\n", path_.c_str());
      return;  // tests/check_skips.py then reports this entry's ledger missing
    }
    for (int i = 0; i < unit.total_test_suite_count(); ++i) {
      const ::testing::TestSuite& suite = *unit.GetTestSuite(i);
      for (int j = 0; j < suite.total_test_count(); ++j) {
        const ::testing::TestInfo& t = *suite.GetTestInfo(j);
        const std::string name = std::string(t.test_suite_name()) + "." + t.name();
        if (!t.should_run()) {
          out << "FILTERED " << name << "\n";
        } else if (t.result()->Skipped()) {
          std::string why;
          for (int k = 0; k < t.result()->total_part_count(); ++k) {
            const auto& part = t.result()->GetTestPartResult(k);
            if (part.skipped()) why += part.message();
          }
          out << "SKIPPED " << name << "\t" << one_line(why.empty() ? "(no reason given)" : why) << "\n";
        } else {
          out << "RAN " << name << "\n";
        }
      }
    }
    out.close();
    std::rename((path_ + ".tmp").c_str(), path_.c_str());
  }

 private:
  std::string path_;
};

}  // namespace

void install_ledger(bool write) {
  const char* path = std::getenv("MESHTRAIN_TEST_LEDGER");
  if (!write || path == nullptr || *path == '\0') return;
  ::testing::UnitTest::GetInstance()->listeners().Append(new LedgerListener(path));
}

}  // namespace meshtrain::test
