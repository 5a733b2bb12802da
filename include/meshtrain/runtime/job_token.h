// The job token: a secret every process of a multi-host job proves it knows
// before it joins rank 0's store (issue #43).
//
// c10d's TCPStore authenticates nobody: any process that reaches the master
// port could join the rendezvous as a rank, and a rank started with the wrong
// MASTER_ADDR:MASTER_PORT could join another job. Every node sets the same
// secret: MESHTRAIN_JOB_TOKEN (at least 16 characters) or
// MESHTRAIN_JOB_TOKEN_FILE (a file holding it, readable by its owner only).
// It is required when the job spans hosts over a TCP store, and checked
// whenever it is given.
//
// Protocol, run on every TCP store right after it connects, before any group:
//   rank 0  nonce (16 random bytes)           -> meshtrain/auth/nonce
//           HMAC(token, "serve|" nonce)        -> meshtrain/auth/serve  ("none" without a token)
//   rank r  checks rank 0's proof (another job's store is refused), then
//           HMAC(token, "join|" nonce "|" r)   -> meshtrain/auth/join/r ("none" without a token)
//   rank 0  checks every proof                 -> meshtrain/auth/verdict/r: "ok", "refused" (r's own
//           proof was wrong) or "others:R,R" (the job is refused because of those ranks)
// HMAC is HMAC-SHA256 (RFC 2104, OpenSSL). The token never crosses the
// network; a proof is bound to one rendezvous (the nonce) and one rank.
// What it does not do: TCPStore still accepts any connection and any write,
// so a host that reaches the port can disturb a rendezvous (deny service),
// though it cannot join one unnoticed.
#pragma once

#include <chrono>
#include <optional>
#include <string>

namespace c10d {
class Store;
}

namespace meshtrain {

// The token from the environment, if any. Throws std::invalid_argument naming
// the variable and the fix: both variables set, a file that cannot be read or
// that others can read, a token shorter than 16 characters.
std::optional<std::string> job_token();

// A loopback address ("localhost", 127.x.y.z, "::1"): the store is not on the network.
bool loopback_host(const std::string& host);

// For a launching process: the token's variables are well formed, and a job
// that spans hosts (`across_hosts`) has one. Throws std::invalid_argument.
void check_job_token(bool across_hosts);

// The protocol above, on a connected store. Throws std::runtime_error naming
// what was refused and the fix.
void authenticate_rendezvous(c10d::Store& store, int rank, int world, const std::optional<std::string>& token);

// HMAC-SHA256 of `message` under `key`, as 64 hex digits.
std::string hmac_sha256_hex(const std::string& key, const std::string& message);

}  // namespace meshtrain
