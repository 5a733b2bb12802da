// main() of the multi-process tests. Every rank runs every test; assertions use
// EXPECT (not ASSERT) so all ranks keep making the same collective calls. Rank 0
// prints the usual report, the others only their failures; the launcher fails
// the run when any rank exits non-zero.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>

#include "meshtrain/platform/cuda_loader.h"
#include "meshtrain/methods/builtin.h"
#include "tests/ledger.h"
#include "tests/mp.h"

namespace meshtrain::test {
namespace {
std::unique_ptr<Runtime> g_runtime;

class FailurePrinter : public ::testing::EmptyTestEventListener {
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed()) std::printf("%s:%d: failure\n%s\n", r.file_name(), r.line_number(), r.summary());
  }
};
}  // namespace

Runtime& runtime() { return *g_runtime; }

}  // namespace meshtrain::test

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  ::testing::InitGoogleTest(&argc, argv);
  meshtrain::load_cuda_where_a_driver_is();  // before any ATen call (platform/cuda_loader.h)
  meshtrain::register_builtin_methods();     // train.method = dpo, reward, grpo, ppo (train/method.h)
  meshtrain::RuntimeOptions opts;
  opts.timeout = std::chrono::seconds(60);  // a desync fails in a minute, not five
  meshtrain::test::g_runtime = meshtrain::Runtime::init(meshtrain::DistEnv::from_environment(), opts);
  if (meshtrain::test::g_runtime->rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new meshtrain::test::FailurePrinter);
  }
  meshtrain::test::install_ledger(meshtrain::test::g_runtime->rank() == 0);  // every rank skips alike
  int rc = RUN_ALL_TESTS();
  meshtrain::test::g_runtime->world().barrier();
  return rc;
}
