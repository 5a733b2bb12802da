// The multi-host job token (runtime/job_token.h): HMAC-SHA256 against RFC 4231,
// the variables' checks, and the rendezvous protocol on a real TCPStore with
// one thread per rank.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "meshtrain/runtime/job_token.h"

namespace fs = std::filesystem;
using meshtrain::authenticate_rendezvous;
using meshtrain::check_job_token;
using meshtrain::job_token;

namespace {

// Sets (or, with nullopt, unsets) a variable for one scope.
struct EnvVar {
  std::string name;
  std::optional<std::string> old;
  EnvVar(std::string n, std::optional<std::string> v) : name(std::move(n)) {
    if (const char* o = std::getenv(name.c_str())) old = o;
    if (v) ::setenv(name.c_str(), v->c_str(), 1);
    else ::unsetenv(name.c_str());
  }
  ~EnvVar() {
    if (old) ::setenv(name.c_str(), old->c_str(), 1);
    else ::unsetenv(name.c_str());
  }
};

template <typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// Every rank's error ("" when it joined) after one rendezvous with these tokens.
std::vector<std::string> rendezvous(const std::vector<std::optional<std::string>>& tokens) {
  const int world = static_cast<int>(tokens.size());
  c10d::TCPStoreOptions server;
  server.port = 0;
  server.isServer = true;
  server.numWorkers = world;
  server.waitWorkers = false;
  server.timeout = std::chrono::seconds(20);
  auto store0 = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", server);
  std::vector<std::string> errors(world);
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.emplace_back([&, r] {
      c10::intrusive_ptr<c10d::Store> store = store0;
      if (r > 0) {
        c10d::TCPStoreOptions client;
        client.port = store0->getPort();
        client.isServer = false;
        client.timeout = std::chrono::seconds(20);
        store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", client);
      }
      errors[r] = error_of([&] { authenticate_rendezvous(*store, r, world, tokens[r]); });
    });
  }
  for (auto& t : ranks) t.join();
  return errors;
}

}  // namespace

TEST(JobToken, HmacSha256IsRfc4231s) {
  // RFC 4231, test case 2.
  EXPECT_EQ(meshtrain::hmac_sha256_hex("Jefe", "what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

TEST(JobToken, TheVariablesAreChecked) {
  EnvVar v("MESHTRAIN_JOB_TOKEN", std::nullopt), f("MESHTRAIN_JOB_TOKEN_FILE", std::nullopt);
  EXPECT_FALSE(job_token());
  EXPECT_NO_THROW(check_job_token(false));  // one host: none needed
  EXPECT_NE(error_of([] { check_job_token(true); }).find("a job across hosts needs a job token"), std::string::npos);
  {
    EnvVar s("MESHTRAIN_JOB_TOKEN", "short");
    EXPECT_NE(error_of([] { job_token(); }).find("has 5 characters; use at least 16"), std::string::npos);
  }
  const fs::path dir = fs::temp_directory_path() / ("meshtrain_token_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path file = dir / "token";
  std::ofstream(file) << "0123456789abcdef0123\n";
  EnvVar t("MESHTRAIN_JOB_TOKEN_FILE", file.string());
  ::chmod(file.c_str(), 0644);
  EXPECT_NE(error_of([] { job_token(); }).find("others can read it (mode 644); chmod 600"), std::string::npos);
  ::chmod(file.c_str(), 0600);
  EXPECT_EQ(job_token().value_or(""), "0123456789abcdef0123");  // the newline is not the token's
  {
    EnvVar both("MESHTRAIN_JOB_TOKEN", "0123456789abcdef0123");
    EXPECT_NE(error_of([] { job_token(); }).find("both MESHTRAIN_JOB_TOKEN and MESHTRAIN_JOB_TOKEN_FILE"),
              std::string::npos);
  }
  fs::remove_all(dir);
}

TEST(JobToken, TheRendezvousAdmitsOnlyTheSameToken) {
  const std::string good = "the-job-secret-0123456789", bad = "another-secret-0123456789";
  for (const auto& e : rendezvous({good, good, good})) EXPECT_EQ(e, "");
  for (const auto& e : rendezvous({std::nullopt, std::nullopt})) EXPECT_EQ(e, "");  // no token anywhere: open
  // Rank 2 has another token: it is refused, and the job with it.
  auto e = rendezvous({good, good, bad});
  EXPECT_NE(e[0].find("rank(s) 2 presented no job token or a wrong one"), std::string::npos) << e[0];
  EXPECT_NE(e[1].find("rank 0 refused the job: rank(s) 2"), std::string::npos) << e[1];
  EXPECT_NE(e[2].find("rank 0 does not know this node's job token"), std::string::npos) << e[2];
  // A rank without one, where rank 0 requires one.
  e = rendezvous({good, std::nullopt});
  EXPECT_NE(e[1].find("rank 0's node requires a job token and this node has none"), std::string::npos) << e[1];
  EXPECT_NE(e[0].find("rank(s) 1"), std::string::npos) << e[0];
  // A rank with one, where rank 0 has none (another job's store, say).
  e = rendezvous({std::nullopt, good});
  EXPECT_NE(e[1].find("rank 0's node has no job token while this node has one"), std::string::npos) << e[1];
}
