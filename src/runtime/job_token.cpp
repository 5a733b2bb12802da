#include "meshtrain/runtime/job_token.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace meshtrain {
namespace {

constexpr size_t kShortest = 16;

std::string hex(const unsigned char* b, size_t n) {
  std::string out;
  for (size_t i = 0; i < n; ++i) out += fmt::format("{:02x}", b[i]);
  return out;
}

std::string get(c10d::Store& s, const std::string& key) {
  const std::vector<uint8_t> v = s.get(key);
  return std::string(v.begin(), v.end());
}

void set(c10d::Store& s, const std::string& key, const std::string& value) {
  s.set(key, std::vector<uint8_t>(value.begin(), value.end()));
}

bool same(const std::string& a, const std::string& b) {  // constant time in the bytes compared
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string join_proof(const std::optional<std::string>& token, const std::string& nonce, int rank) {
  return token ? hmac_sha256_hex(*token, fmt::format("join|{}|{}", nonce, rank)) : "none";
}

}  // namespace

std::string hmac_sha256_hex(const std::string& key, const std::string& message) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  if (!HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(message.data()),
            message.size(), out, &n)) {
    throw std::runtime_error("HMAC-SHA256 failed (OpenSSL)");
  }
  return hex(out, n);
}

std::optional<std::string> job_token() {
  const char* value = std::getenv("MESHTRAIN_JOB_TOKEN");
  const char* file = std::getenv("MESHTRAIN_JOB_TOKEN_FILE");
  if (value && file) {
    throw std::invalid_argument("both MESHTRAIN_JOB_TOKEN and MESHTRAIN_JOB_TOKEN_FILE are set: give one");
  }
  std::string token, from = "MESHTRAIN_JOB_TOKEN";
  if (value) {
    token = value;
  } else if (file) {
    from = fmt::format("MESHTRAIN_JOB_TOKEN_FILE={}", file);
    struct stat st {};
    if (::stat(file, &st) != 0 || !S_ISREG(st.st_mode)) {
      throw std::invalid_argument(fmt::format("{}: not a readable file", from));
    }
    if ((st.st_mode & 077) != 0) {
      throw std::invalid_argument(fmt::format("{}: others can read it (mode {:o}); chmod 600 {}", from,
                                              st.st_mode & 0777, file));
    }
    std::ifstream in(file);
    if (!in) throw std::invalid_argument(fmt::format("{}: cannot be read", from));
    std::getline(in, token);
    while (!token.empty() && (token.back() == '\r' || token.back() == ' ' || token.back() == '\t')) token.pop_back();
  } else {
    return std::nullopt;
  }
  if (token.size() < kShortest) {
    throw std::invalid_argument(fmt::format("{}: the job token has {} characters; use at least {} (e.g. the output "
                                            "of `openssl rand -hex 16`)",
                                            from, token.size(), kShortest));
  }
  return std::make_optional(token);  // a copy: GCC 12 warns (-Warray-bounds, falsely) on the move
}

bool loopback_host(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}

void check_job_token(bool across_hosts) {
  if (!job_token() && across_hosts) {
    throw std::invalid_argument(
        "a job across hosts needs a job token: set the same secret on every node, as MESHTRAIN_JOB_TOKEN (e.g. "
        "`export MESHTRAIN_JOB_TOKEN=$(openssl rand -hex 16)` once, passed to each node) or MESHTRAIN_JOB_TOKEN_FILE "
        "(a file on a shared filesystem, chmod 600); rank 0's store otherwise admits any process that reaches it");
  }
}

void authenticate_rendezvous(c10d::Store& store, int rank, int world, const std::optional<std::string>& token) {
  if (rank == 0) {
    unsigned char bytes[16];
    if (RAND_bytes(bytes, sizeof bytes) != 1) throw std::runtime_error("rendezvous: no random bytes for the nonce");
    const std::string nonce = hex(bytes, sizeof bytes);
    set(store, "meshtrain/auth/nonce", nonce);
    set(store, "meshtrain/auth/serve", token ? hmac_sha256_hex(*token, "serve|" + nonce) : "none");
    std::vector<int> wrong;
    for (int r = 1; r < world; ++r) {
      const std::string proof = get(store, fmt::format("meshtrain/auth/join/{}", r));
      if (token && !same(proof, join_proof(token, nonce, r))) wrong.push_back(r);
    }
    for (int r = 1; r < world; ++r) {
      const bool own = std::find(wrong.begin(), wrong.end(), r) != wrong.end();
      set(store, fmt::format("meshtrain/auth/verdict/{}", r),
          wrong.empty() ? "ok" : own ? "refused" : fmt::format("others:{}", fmt::join(wrong, ",")));
    }
    if (!wrong.empty()) {
      throw std::runtime_error(fmt::format(
          "rendezvous: rank(s) {} presented no job token or a wrong one; this job admits only ranks with the same "
          "MESHTRAIN_JOB_TOKEN (or MESHTRAIN_JOB_TOKEN_FILE) as this node: set the same secret on every node",
          fmt::join(wrong, ", ")));
    }
    return;
  }
  const std::string nonce = get(store, "meshtrain/auth/nonce");
  const std::string serve = get(store, "meshtrain/auth/serve");
  if (token && serve == "none") {
    set(store, fmt::format("meshtrain/auth/join/{}", rank), "none");
    throw std::runtime_error(
        "rendezvous: rank 0's node has no job token while this node has one: set the same MESHTRAIN_JOB_TOKEN on "
        "every node (or check MASTER_ADDR / MASTER_PORT: this may be another job's store)");
  }
  if (token && !same(serve, hmac_sha256_hex(*token, "serve|" + nonce))) {
    set(store, fmt::format("meshtrain/auth/join/{}", rank), "none");
    throw std::runtime_error(
        "rendezvous: rank 0 does not know this node's job token: MESHTRAIN_JOB_TOKEN differs between the nodes, or "
        "MASTER_ADDR / MASTER_PORT name another job's store");
  }
  set(store, fmt::format("meshtrain/auth/join/{}", rank), join_proof(token, nonce, rank));
  const std::string verdict = get(store, fmt::format("meshtrain/auth/verdict/{}", rank));
  if (verdict == "refused") {
    throw std::runtime_error(fmt::format(
        "rendezvous: rank 0 refused rank {}: {}; set the same MESHTRAIN_JOB_TOKEN (or MESHTRAIN_JOB_TOKEN_FILE) on "
        "every node",
        rank, token ? "its job token differs from rank 0's node's" : "rank 0's node requires a job token and this "
                                                                      "node has none"));
  }
  if (verdict != "ok") {
    throw std::runtime_error(fmt::format("rendezvous: rank 0 refused the job: rank(s) {} presented no job token or a "
                                         "wrong one",
                                         verdict.substr(verdict.find(':') + 1)));
  }
}

}  // namespace meshtrain
