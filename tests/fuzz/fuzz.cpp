// The fuzz driver and its mutators (fuzz.h).
#include "fuzz.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <new>
#include <sstream>

#include <nlohmann/json.hpp>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#endif

namespace fs = std::filesystem;

namespace fuzz {

namespace {

constexpr size_t kMaxInput = 1 << 20;  // mutations never grow an input past 1 MiB
constexpr unsigned kSecondsPerInput = 10;

uint64_t splitmix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

uint64_t name_hash(const std::string& s) {
  uint64_t h = 1469598103934665603ULL;  // FNV-1a
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ULL;
  return h;
}

// The input under test, for the crash and timeout handlers (which may only call write(2)).
std::string g_input;
char g_failure_path[4096];

void save_input_and_say(const char* why) {
  const int fd = ::open(g_failure_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd >= 0) {
    for (size_t off = 0; off < g_input.size();) {
      const ssize_t n = ::write(fd, g_input.data() + off, g_input.size() - off);
      if (n <= 0) break;
      off += static_cast<size_t>(n);
    }
    ::close(fd);
  }
  const char* parts[] = {"fuzz: ", why, "; the input is in ", g_failure_path, "\n"};
  for (const char* p : parts) {
    if (::write(2, p, std::strlen(p)) < 0) return;
  }
}

void on_sanitizer_death() { save_input_and_say("a sanitizer report (above)"); }
// UBSan's reports end the process without calling it: run_one writes each input first.

void on_alarm(int) {
  save_input_and_say("an input took longer than the per-input limit");
  ::_exit(3);
}

// A refusal a user could not act on: a library's raw exception escaped the parser.
std::string unclear(const std::exception& e) {
  if (dynamic_cast<const std::bad_alloc*>(&e)) return "std::bad_alloc (an allocation sized by the input)";
  if (dynamic_cast<const std::length_error*>(&e)) return std::string("std::length_error: ") + e.what();
  const std::string m = e.what();
  if (m.empty()) return "an exception without a message";
  for (const char* raw : {"[json.exception", "stoi", "stol", "stoul", "stof", "stod", "vector::", "basic_string",
                          "map::at", "std::", "bad_", "unordered_map::at", "Error while parsing"}) {
    if (m.rfind(raw, 0) == 0) return "a raw library exception escaped: " + m;
  }
  return "";
}

// What a corpus file must do, by its name: valid-* (a well-formed input) be
// accepted, refuse-* (a past finding) be refused clearly; any other just not fail.
enum class Expect { Accept, Refuse, Either };

std::vector<std::string> corpus_files(const std::string& target, std::vector<Expect>* expect) {
  std::vector<std::string> out;
  const fs::path dir = fs::path(MESHTRAIN_FUZZ_CORPUS) / target;
  std::error_code ec;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir, ec)) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  for (const auto& f : files) {
    out.push_back(read_file(f.string()));
    const std::string name = f.filename().string();
    expect->push_back(name.rfind("valid", 0) == 0    ? Expect::Accept
                      : name.rfind("refuse", 0) == 0 ? Expect::Refuse
                                                     : Expect::Either);
  }
  return out;
}

struct Outcome {
  bool failed = false;
  std::string why;  // the failure, or the refusal's message
  bool accepted = false;
};

Outcome run_one(const Target& t, const std::string& input) {
  g_input = input;
  // On disk before the parser runs: UBSan's reports end the process without the death callback.
  std::ofstream(g_failure_path, std::ios::binary | std::ios::trunc) << input;
  Outcome o;
  ::alarm(kSecondsPerInput);
  try {
    t.run(input);
    o.accepted = true;
  } catch (const BadAccept& e) {
    o = {true, std::string("accepted what it should refuse: ") + e.what()};
  } catch (const std::exception& e) {
    const std::string u = unclear(e);
    o = u.empty() ? Outcome{false, e.what()} : Outcome{true, "an unclear refusal: " + u};
  } catch (...) {
    o = {true, "a non-std exception"};
  }
  ::alarm(0);
  return o;
}

std::string arg(int argc, char** argv, int& i) {
  if (i + 1 >= argc) throw std::invalid_argument(std::string(argv[i]) + " needs a value");
  return argv[++i];
}

}  // namespace

const std::vector<std::string>& hostile_numbers() {
  static const std::vector<std::string> n{"-1", "0", "1", "7", "-9223372036854775808", "9223372036854775807",
                                          "18446744073709551615", "18446744073709551616", "4294967296", "1e12",
                                          "1e308", "1e400", "-0", "2.5", "nan", "inf", "-inf", "0x10", "1_000",
                                          "2147483648", "65536", "99999999999999999999999"};
  return n;
}

std::string mutate_bytes(const std::string& in, const std::vector<std::string>& others,
                         const std::vector<std::string>& dictionary, Rng& r) {
  std::string f = in;
  auto at = [&](size_t extra = 0) { return r.below(f.size() + extra); };
  switch (r.below(10)) {
    case 0:  // bit flips
      if (!f.empty()) {
        for (size_t k = 0, m = 1 + r.below(8); k < m; ++k) f[at()] ^= static_cast<char>(1 << r.below(8));
      }
      break;
    case 1: {  // an interesting byte
      static const unsigned char bytes[] = {0, 0xff, 0x7f, 0x80, '"', '\\', '\n', '\r', '{', '}', '[', ']', ',', ':',
                                            '=', '.', '-', '0', '#', '\'', 0xc3, 0xe2, 0xf0};
      if (!f.empty()) f[at()] = static_cast<char>(bytes[r.below(sizeof bytes)]);
      break;
    }
    case 2: {  // an interesting 64- or 32-bit little-endian word, often aligned (binary headers)
      const uint64_t words[] = {0, 1, 2, UINT64_MAX, UINT64_MAX - 7, uint64_t{1} << 63, uint64_t{1} << 32,
                                uint64_t{1} << 31, f.size(), f.size() + 1, f.size() / 2, 0xffffffffULL, r.next()};
      const uint64_t v = words[r.below(sizeof words / sizeof words[0])];
      const size_t width = r.below(2) ? 8 : 4;
      if (f.size() < width) break;
      size_t pos = r.below(f.size() - width + 1);
      if (r.below(2)) pos -= pos % width;
      for (size_t b = 0; b < width; ++b) f[pos + b] = static_cast<char>((v >> (8 * b)) & 0xff);
      break;
    }
    case 3:  // a cut
      if (!f.empty()) {
        const size_t pos = at(), len = 1 + r.below(r.below(2) ? 16 : f.size());
        f.erase(pos, len);
      }
      break;
    case 4:  // a range copied elsewhere
      if (!f.empty()) {
        const size_t pos = at(), len = 1 + r.below(std::min<size_t>(f.size() - pos, 64));
        f.insert(at(1), f.substr(pos, len));
      }
      break;
    case 5: {  // a dictionary token or a number inserted
      const auto& numbers = hostile_numbers();
      const std::string& tok = !dictionary.empty() && r.below(2) ? dictionary[r.below(dictionary.size())]
                                                                 : numbers[r.below(numbers.size())];
      f.insert(at(1), tok);
      break;
    }
    case 6: {  // a number replaced
      std::vector<std::pair<size_t, size_t>> runs;
      for (size_t i = 0; i < f.size(); ++i) {
        if (!isdigit(static_cast<unsigned char>(f[i]))) continue;
        size_t b = i > 0 && f[i - 1] == '-' ? i - 1 : i, e = i;
        while (e < f.size() && (isdigit(static_cast<unsigned char>(f[e])) || f[e] == '.' || f[e] == 'e')) ++e;
        runs.emplace_back(b, e);
        i = e;
      }
      if (runs.empty()) break;
      const auto [b, e] = runs[r.below(runs.size())];
      f.replace(b, e - b, hostile_numbers()[r.below(hostile_numbers().size())]);
      break;
    }
    case 7:  // truncated
      f.resize(at());
      break;
    case 8:  // spliced with another input
      if (!others.empty()) {
        const std::string& o = others[r.below(others.size())];
        f = f.substr(0, at(1)) + o.substr(r.below(o.size() + 1));
      }
      break;
    default: {  // a line repeated or dropped
      std::vector<std::string> lines;
      std::istringstream s(f);
      for (std::string l; std::getline(s, l);) lines.push_back(l);
      if (lines.empty()) break;
      const size_t k = r.below(lines.size());
      if (r.below(2)) lines.insert(lines.begin() + static_cast<long>(k), lines[k]);
      else lines.erase(lines.begin() + static_cast<long>(k));
      f.clear();
      for (const auto& l : lines) f += l + "\n";
    }
  }
  if (f.size() > kMaxInput) f.resize(kMaxInput);
  return f;
}

// Every node of `j` by its JSON pointer.
void json_pointers(const nlohmann::json& j, const std::string& at, std::vector<std::string>& out) {
  out.push_back(at);
  if (j.is_object()) {
    for (const auto& [k, v] : j.items()) {
      std::string token;  // RFC 6901 escapes: keys may hold '/'
      for (char c : k) token += c == '~' ? std::string("~0") : c == '/' ? std::string("~1") : std::string(1, c);
      json_pointers(v, at + "/" + token, out);
    }
  } else if (j.is_array()) {
    for (size_t i = 0; i < j.size(); ++i) json_pointers(j[i], at + "/" + std::to_string(i), out);
  }
}

std::string mutate_json(const std::string& in, Rng& r) {
  nlohmann::json m;
  try {
    m = nlohmann::json::parse(in);
  } catch (const std::exception&) {
    return in;
  }
  static const std::vector<nlohmann::json> values{
      -1, 0, 1, 2, 3, 7, INT64_MAX, INT64_MIN, UINT64_MAX, 1e12, 2.5, -0.0, 1e308, nullptr, "", "x", "..", "/etc/passwd",
      "a/b", std::string(4096, 'a'), "<|end|>\n", "<|user|>\n", std::string("\0a", 2), true, false,
      nlohmann::json::array(), nlohmann::json::array({-1, 2}), nlohmann::json::array({1, 2, 3}),
      nlohmann::json::array({"a", "b"}), nlohmann::json::object(), nlohmann::json::parse(R"({"role":"user"})")};
  std::vector<std::string> ptrs;
  json_pointers(m, "", ptrs);
  for (size_t k = 0, rounds = 1 + r.below(3); k < rounds && ptrs.size() > 1; ++k) {
    const nlohmann::json::json_pointer p(ptrs[1 + r.below(ptrs.size() - 1)]);
    if (!m.contains(p)) continue;
    const nlohmann::json::json_pointer parent = p.parent_pointer();
    switch (r.below(5)) {
      case 0:
        m[p] = values[r.below(values.size())];
        break;
      case 1:  // a key or an element deleted
        if (m[parent].is_object()) m[parent].erase(p.back());
        else if (m[parent].is_array() && !m[parent].empty()) m[parent].erase(m[parent].begin() + std::stol(p.back()));
        break;
      case 2:  // an element repeated, or a node copied into another key
        if (m[parent].is_array()) m[parent].push_back(m[p]);
        else if (m[parent].is_object()) m[parent][p.back() + "_"] = m[p];
        break;
      case 3:  // a number's sign, size or type changed
        if (m[p].is_number()) m[p] = r.below(2) ? nlohmann::json(-m[p].get<double>()) : nlohmann::json(m[p].dump());
        else if (m[p].is_string()) m[p] = r.below(2) ? nlohmann::json(m[p].get<std::string>() + m[p].get<std::string>())
                                                      : nlohmann::json::array({m[p]});
        break;
      default:  // wrapped in a list
        m[p] = nlohmann::json::array({m[p]});
    }
    ptrs.clear();
    json_pointers(m, "", ptrs);
  }
  return m.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string mutate_jsonl(const std::string& in, Rng& r) {
  std::vector<std::string> lines;
  std::istringstream s(in);
  for (std::string l; std::getline(s, l);) lines.push_back(l);
  if (lines.empty()) return in;
  const size_t k = r.below(lines.size());
  switch (r.below(4)) {
    case 0:
    case 1:
      lines[k] = mutate_json(lines[k], r);
      break;
    case 2:
      lines.insert(lines.begin() + static_cast<long>(k), r.below(2) ? std::string(" \t\r") : lines[r.below(lines.size())]);
      break;
    default:
      std::swap(lines[k], lines[r.below(lines.size())]);
  }
  std::string out;
  for (const auto& l : lines) out += l + "\n";
  return out;
}

const std::string& scratch() {
  static const std::string dir = [] {
    std::string t = (fs::temp_directory_path() / "meshtrain_fuzz_XXXXXX").string();
    if (!::mkdtemp(t.data())) throw std::runtime_error("mkdtemp failed");
    return t;
  }();
  return dir;
}

std::string write_scratch(const std::string& name, const std::string& bytes) {
  const std::string path = (fs::path(scratch()) / name).string();
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  return path;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

int run_targets(int argc, char** argv, std::vector<Target> targets) {
  double seconds = 10;
  uint64_t seed = 1;
  std::string only, replay;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--seconds") seconds = std::stod(arg(argc, argv, i));
      else if (a == "--seed") seed = std::stoull(arg(argc, argv, i));
      else if (a == "--only") only = arg(argc, argv, i);
      else if (a == "--replay") replay = arg(argc, argv, i);
      else throw std::invalid_argument("unknown option " + a + " (--seconds S --seed N --only TARGET --replay FILE)");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", argv[0], e.what());
    return 2;
  }
#if defined(__SANITIZE_ADDRESS__)
  __sanitizer_set_death_callback(on_sanitizer_death);
#endif
  ::signal(SIGALRM, on_alarm);
  int failures = 0;
  bool ran = false;
  for (Target& t : targets) {
    if (!only.empty() && t.name != only) continue;
    ran = true;
    std::snprintf(g_failure_path, sizeof g_failure_path, "%s/fuzz-failure-%s.bin", fs::current_path().c_str(),
                  t.name.c_str());
    if (!replay.empty()) {
      const Outcome o = run_one(t, read_file(replay));
      std::printf("fuzz %s: replay of %s: %s\n", t.name.c_str(), replay.c_str(),
                  o.accepted ? "accepted" : o.failed ? o.why.c_str() : ("refused clearly: " + o.why).c_str());
      failures += o.failed;
      continue;
    }
    std::vector<Expect> expect;
    std::vector<std::string> seeds = corpus_files(t.name, &expect);
    for (const auto& s : t.seeds) {
      seeds.push_back(s);
      expect.push_back(Expect::Accept);
    }
    int failed_here = 0;
    for (size_t k = 0; k < seeds.size(); ++k) {
      const Outcome o = run_one(t, seeds[k]);
      std::string why = o.failed ? o.why : "";
      if (!o.failed && expect[k] == Expect::Accept && !o.accepted) why = "(a valid input) was refused: " + o.why;
      if (!o.failed && expect[k] == Expect::Refuse && o.accepted) why = "(a past finding) was accepted";
      if (!why.empty()) {
        std::fprintf(stderr, "fuzz %s: corpus input %zu %s\n", t.name.c_str(), k, why.c_str());
        ++failed_here;
      }
    }
    if (seeds.empty()) {
      std::fprintf(stderr, "fuzz %s: no seeds\n", t.name.c_str());
      ++failed_here;
    }
    // Mutations start from the inputs a parser accepts.
    std::vector<std::string> valid;
    for (size_t k = 0; k < seeds.size(); ++k) {
      if (expect[k] == Expect::Accept) valid.push_back(seeds[k]);
    }
    seeds = valid;
    const auto stop = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    const uint64_t base = splitmix(seed ^ name_hash(t.name));
    long n = 0, accepted = 0;
    for (; failed_here < 5 && !seeds.empty() && std::chrono::steady_clock::now() < stop; ++n) {
      Rng r{splitmix(base + static_cast<uint64_t>(n)) | 1};
      std::string input = seeds[r.below(seeds.size())];
      for (size_t k = 0, rounds = 1 + r.below(3); k < rounds; ++k) {
        try {
          input = t.mutate && r.below(2) ? t.mutate(input, r) : mutate_bytes(input, seeds, t.dictionary, r);
        } catch (const std::exception&) {
          // a structure-aware mutator that met a shape it does not know: this round leaves the input as it was
        }
      }
      const Outcome o = run_one(t, input);
      accepted += o.accepted;
      if (!o.failed) continue;
      const std::string path = fs::current_path() / ("fuzz-failure-" + t.name + "-" + std::to_string(n) + ".bin");
      std::ofstream(path, std::ios::binary) << input;
      std::fprintf(stderr, "fuzz %s: iteration %ld (seed %llu): %s\n  input: %s (replay: %s --only %s --replay %s)\n",
                   t.name.c_str(), n, static_cast<unsigned long long>(seed), o.why.c_str(), path.c_str(), argv[0],
                   t.name.c_str(), path.c_str());
      ++failed_here;
    }
    std::error_code ec;
    fs::remove(g_failure_path, ec);  // the last input passed
    std::printf("fuzz %s: %ld inputs in %.0f s (%ld accepted), %zu seeds, %d failures\n", t.name.c_str(), n, seconds,
                accepted, seeds.size(), failed_here);
    std::fflush(stdout);
    failures += failed_here;
  }
  std::error_code ec;
  fs::remove_all(scratch(), ec);
  if (!ran) {
    std::fprintf(stderr, "%s: no target named %s\n", argv[0], only.c_str());
    return 2;
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace fuzz
