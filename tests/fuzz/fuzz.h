// A small mutation fuzzer for meshtrain's parsers (issue #43 item 2).
//
// Each target is a parser as a loader calls it, seeds (valid inputs: from
// tests/fuzz/corpus/<target>/valid-* and from the target's code for binary
// formats) and an oracle. Past findings stay in the corpus as regression
// inputs: refuse-* must be refused clearly, any other name must not fail. The driver mutates seeds for a fixed time per target,
// deterministically from (seed, target, iteration), so a failure names its
// iteration and writes its input to a file that `--replay` runs again.
//
// A target passes an input when the parser either accepts it and the oracle
// finds the result consistent, or refuses it with a clear error: an exception
// of meshtrain's own (std::invalid_argument / std::runtime_error with a message
// that names the problem). A failure is: a sanitizer report (the binaries are
// built with ASan + UBSan; the run aborts and the input is written first), an
// accept the oracle rejects (BadAccept), an unclear refusal (a library's raw
// exception: "[json.exception...", toml++'s "Error while parsing", "stoll", "vector::_M_range_check",
// std::bad_alloc, ...), or an input that takes longer than 10 s.
#pragma once

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace fuzz {

// xorshift64*: the mutation stream.
struct Rng {
  uint64_t s;
  uint64_t next() {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    return s * 0x2545F4914F6CDD1DULL;
  }
  size_t below(size_t n) { return n == 0 ? 0 : static_cast<size_t>(next() % n); }
};

// Thrown by an oracle: the parser accepted an input it should have refused.
struct BadAccept : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Target {
  std::string name;
  std::vector<std::string> seeds;       // valid inputs made in code (added to the corpus files)
  std::vector<std::string> dictionary;  // tokens worth inserting: keys, markers
  // Structure-aware mutation of one seed (optional; the byte mutator runs too).
  std::function<std::string(const std::string& seed, Rng&)> mutate;
  // Parses `input` as a loader would; throws BadAccept for a wrong accept.
  std::function<void(const std::string& input)> run;
};

// Numbers a hostile file would hold: signs, limits, wrap-arounds, off-by-ones.
const std::vector<std::string>& hostile_numbers();

// Byte-level mutations: bit flips, interesting bytes and 64-bit words, cuts,
// copies, dictionary tokens, numbers replaced, splices with `others`.
std::string mutate_bytes(const std::string& in, const std::vector<std::string>& others,
                         const std::vector<std::string>& dictionary, Rng& r);
// A JSON document's nodes replaced, deleted or copied (the input returned
// unchanged when it is not JSON).
std::string mutate_json(const std::string& in, Rng& r);
// Every node of `j` by its JSON pointer (RFC 6901), `at` first.
void json_pointers(const nlohmann::json& j, const std::string& at, std::vector<std::string>& out);
// One line of a JSON-lines text mutated with mutate_json, or lines repeated / dropped.
std::string mutate_jsonl(const std::string& in, Rng& r);

// A private directory for the run's files (removed at exit), and a file in it.
const std::string& scratch();
std::string write_scratch(const std::string& name, const std::string& bytes);
std::string read_file(const std::string& path);

// fuzz BINARY [--seconds S] [--seed N] [--only NAME] [--replay FILE]: runs
// every target (or one) for S seconds each (default 10); returns the exit code.
int run_targets(int argc, char** argv, std::vector<Target> targets);

}  // namespace fuzz
