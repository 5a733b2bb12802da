// Checkpoints in one process: the safetensors format, checksums and
// corruption, truncated and missing shards, a save that fails midway, keep-K,
// async saves, reading a box of a tensor written in shards, export.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <cstdlib>
#include <chrono>
#include <thread>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>

#include "meshtrain/ckpt/checkpoint.h"
#include "meshtrain/ckpt/flat_boxes.h"
#include "meshtrain/ckpt/safetensors.h"
#include "meshtrain/comm/comm.h"

namespace meshtrain::ckpt {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("meshtrain_ckpt_" + std::to_string(getpid()));
  TempDir() {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// Two shards of one tensor "model/w" at offsets 0 and 3 (the layout two tp ranks write).
std::vector<Piece> sharded(float base) {
  at::Tensor w = at::arange(24, at::kFloat).view({6, 4}) + base;
  return {{"model/w", w.narrow(0, 0, 3), {6, 4}, {0, 0}, true}, {"model/b", at::full({4}, base), {4}, {0}, true}};
}

// Every range of every small shape: the boxes are in flat order, each one
// contiguous from its start, and together they cover exactly the range.
TEST(FlatBoxes, EveryRangeIsTiledByContiguousBoxes) {
  for (const std::vector<int64_t>& shape : std::vector<std::vector<int64_t>>{{}, {7}, {3, 5}, {2, 3, 4}, {2, 1, 3, 2}}) {
    int64_t volume = 1;
    for (int64_t s : shape) volume *= s;
    std::vector<int64_t> strides(shape.size(), 1);
    for (int64_t d = static_cast<int64_t>(shape.size()) - 2; d >= 0; --d) strides[d] = strides[d + 1] * shape[d + 1];
    for (int64_t b = 0; b <= volume; ++b) {
      for (int64_t e = b; e <= volume; ++e) {
        const auto boxes = flat_range_boxes(shape, b, e);
        EXPECT_LE(boxes.size(), std::max<size_t>(1, 2 * shape.size() - 1));
        int64_t next = b;
        for (const auto& box : boxes) {
          ASSERT_EQ(box.start, next) << "shape dims " << shape.size() << " range " << b << ".." << e;
          // Walk the box in row-major order: its elements are next, next + 1, ...
          const size_t nd = shape.size();
          std::vector<int64_t> idx(nd, 0);
          int64_t n = 1;
          for (size_t d = 0; d < nd; ++d) n *= box.shape[d];
          for (int64_t k = 0; k < n; ++k) {
            int64_t flat = 0;
            for (size_t d = 0; d < nd; ++d) {
              EXPECT_LT(box.offsets[d] + idx[d], shape[d]);
              flat += (box.offsets[d] + idx[d]) * strides[d];
            }
            ASSERT_EQ(flat, next++);
            for (int64_t d = static_cast<int64_t>(nd) - 1; d >= 0 && ++idx[d] == box.shape[d]; --d) {
              idx[d] = 0;
            }
          }
        }
        EXPECT_EQ(next, e);
      }
    }
  }
  EXPECT_THROW(flat_range_boxes({3}, 2, 4), std::invalid_argument);
}

TEST(Safetensors, RoundTripAndBadFiles) {
  TempDir d;
  at::Tensor a = at::randn({3, 5}), b = at::arange(7, at::kLong), c = at::randn({2, 2}).to(at::kBFloat16);
  const auto sums = write_safetensors(d / "x.safetensors", {{"a", a}, {"b", b}, {"c", c}}, {{"k", "v"}});
  ASSERT_EQ(sums.size(), 3u);
  SafetensorsFile f(d / "x.safetensors");
  EXPECT_TRUE(at::equal(f.get("a"), a));
  EXPECT_TRUE(at::equal(f.get("b"), b));
  EXPECT_TRUE(at::equal(f.get("c"), c));
  EXPECT_EQ(f.metadata().at("k"), "v");
  auto bytes = f.bytes("a");
  EXPECT_EQ(xxh64_hex(bytes.data(), bytes.size()), sums[0]);
  // The header is 8-byte aligned, so data starts aligned (the format's rule).
  std::ifstream in(d / "x.safetensors", std::ios::binary);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  EXPECT_EQ(n % 8, 0u);
  // Truncated: the last tensor runs past the end.
  fs::copy_file(d / "x.safetensors", d / "t.safetensors");
  fs::resize_file(d / "t.safetensors", fs::file_size(d / "x.safetensors") - 3);
  EXPECT_NE(error_of([&] { SafetensorsFile t(d / "t.safetensors"); }).find("truncated"), std::string::npos);
  std::ofstream(d / "garbage.safetensors") << "not a safetensors file at all";
  EXPECT_NE(error_of([&] { SafetensorsFile t(d / "garbage.safetensors"); }).find("not a valid safetensors file"),
            std::string::npos);
  // Hostile headers: a negative size, a product that wraps around, offsets past the end.
  auto raw = [&](std::string header) {
    header.resize((header.size() + 7) / 8 * 8, ' ');
    const uint64_t n = header.size();
    std::ofstream f(d / "h.safetensors", std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(&n), 8);
    f << header << std::string(16, '\0');
    f.close();
    return error_of([&] { SafetensorsFile t(d / "h.safetensors"); });
  };
  auto handmade = [&](const std::string& entry) { return raw("{\"x\":" + entry + "}"); };
  EXPECT_EQ(handmade(R"({"dtype":"F32","shape":[2,2],"data_offsets":[0,16]})"), "") << "the valid one opens";
  EXPECT_NE(handmade(R"({"dtype":"F32","shape":[-1,4],"data_offsets":[0,16]})").find("not a size"), std::string::npos);
  EXPECT_NE(handmade(R"({"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]})").find("not a size"),
            std::string::npos);
  EXPECT_NE(handmade(R"({"dtype":"F32","shape":[2,2],"data_offsets":[18446744073709551600,0]})").find("do not fit"),
            std::string::npos);
  EXPECT_NE(handmade(R"({"dtype":"U8","shape":[16],"data_offsets":[18446744073709551600,18446744073709551616]})"), "");
  const std::string e = R"({"dtype":"U8","shape":[8],"data_offsets":[0,8]})";
  EXPECT_EQ(raw("{\"x\":" + e + ",\"y\":" + R"({"dtype":"U8","shape":[8],"data_offsets":[8,16]})" + "}"), "");
  EXPECT_NE(raw("{\"x\":" + e + ",\"x\":" + e + "}").find("'x' appears twice"), std::string::npos);
}

// Manifests damaged or written by someone else are refused before any shard
// file is opened (validate_manifest): paths outside the step directory, shapes
// the shards do not tile (a gap, a shard outside, overlapping shards, an absurd
// size), an empty tensor list, an unknown dtype; and a shard whose file holds
// another shape than the manifest says. `ckpt verify` reports each instead of
// "all checksums match".
TEST(Checkpoint, HostileManifestsAreRefused) {
  TempDir d;
  Comm world("world", 0);
  Checkpointer saver({d.path.string(), 2, false}, world);
  saver.save(1, {{"model/w", at::randn({6, 4}), {6, 4}, {0, 0}, true}, {"model/b", at::randn({4}), {4}, {0}, true}},
             {}, {});
  const std::string dir = *latest(d.path.string());
  const std::string path = dir + "/manifest.json";
  nlohmann::json good;
  std::ifstream(path) >> good;
  using Edit = std::function<void(nlohmann::json&)>;
  for (const auto& [edit, want] : std::vector<std::pair<Edit, std::string>>{
           {[](nlohmann::json& m) { m["tensors"]["model/w"]["shards"][0]["file"] = "/etc/passwd"; }, "not a plain file name"},
           {[](nlohmann::json& m) { m["tensors"]["model/w"]["shards"][0]["file"] = "../x.safetensors"; }, "not a plain file name"},
           {[](nlohmann::json& m) { m["tensors"]["model/w"]["shape"] = {7, 7}; }, "a gap"},
           {[](nlohmann::json& m) { m["tensors"]["model/w"]["shape"] = {int64_t{1000000000000}, 4}; }, "a gap"},
           {[](nlohmann::json& m) { m["tensors"]["model/w"]["shape"] = {int64_t{1} << 62, 4}; }, "larger than any file"},
           {[](nlohmann::json& m) { m["tensors"]["model/w"]["shape"] = {5, 4}; }, "lies outside"},
           {[](nlohmann::json& m) { m["tensors"]["model/w"]["shape"] = {-6, 4}; }, "not a size"},
           {[](nlohmann::json& m) { m["tensors"]["model/w"]["shape"] = {24}; }, "dimensions"},
           {[](nlohmann::json& m) {
              auto& sh = m["tensors"]["model/w"]["shards"];
              sh.push_back(sh[0]);
            }, "overlap"},
           {[](nlohmann::json& m) { m["tensors"] = nlohmann::json::object(); }, "non-empty"},
           {[](nlohmann::json& m) { m["tensors"]["model/b"]["dtype"] = "F99"; }, "dtype"},
           {[](nlohmann::json& m) {
              m["tensors"]["model/w"]["shape"] = {3, 4};
              m["tensors"]["model/w"]["shards"][0]["shape"] = {3, 4};
            }, "the manifest says"}}) {
    nlohmann::json bad = good;
    edit(bad);
    std::ofstream(path, std::ios::trunc) << bad.dump();
    const std::string e = error_of([&] { Reader r(dir); });
    EXPECT_NE(e.find(want), std::string::npos) << want << ": " << e;
    const VerifyReport rep = verify(dir);
    ASSERT_FALSE(rep.problems.empty()) << want;
    if (want != "the manifest says") {
      EXPECT_NE(rep.problems[0].find(want), std::string::npos) << rep.problems[0];
    }
  }
  std::ofstream(path, std::ios::trunc) << good.dump();
  EXPECT_TRUE(verify(dir).problems.empty());
  EXPECT_EQ(error_of([&] { Reader r(dir); }), "");
}

// A manifest of 2·10⁵ shards (a tensor in one-row boxes) validates by a sweep, not by
// comparing every pair (4·10¹⁰ comparisons: it stalled loading); an overlap among them, or
// between column splits, is still found.
TEST(Checkpoint, ManyShardsValidateAndTheirOverlapsAreFound) {
  const int64_t n = 200000;
  nlohmann::json shards = nlohmann::json::array();
  for (int64_t i = 0; i < n; ++i) {
    shards.push_back({{"file", "a.safetensors"}, {"offsets", {i, 0}}, {"shape", {1, 4}}, {"xxh64", "0"}});
  }
  nlohmann::json m{{"tensors", {{"w", {{"dtype", "F32"}, {"shape", {n, 4}}, {"shards", shards}}}}}};
  EXPECT_NO_THROW(validate_manifest(m, "m.json"));
  // One row moved onto its neighbour: an overlap (and a gap).
  m["tensors"]["w"]["shards"][n / 2]["offsets"] = {n / 2 + 1, 0};
  EXPECT_NE(error_of([&] { validate_manifest(m, "m.json"); }).find("overlap"), std::string::npos);
  // Column splits (the sweep runs along dim 1): two halves and a stray box across both.
  nlohmann::json cols{{"tensors", {{"w", {{"dtype", "F32"}, {"shape", {4, 4}}, {"shards", {
      {{"file", "a"}, {"offsets", {0, 0}}, {"shape", {4, 2}}, {"xxh64", "0"}},
      {{"file", "b"}, {"offsets", {0, 2}}, {"shape", {4, 2}}, {"xxh64", "0"}}}}}}}}};
  EXPECT_NO_THROW(validate_manifest(cols, "m.json"));
  cols["tensors"]["w"]["shards"].push_back({{"file", "c"}, {"offsets", {3, 1}}, {"shape", {0, 2}}, {"xxh64", "0"}});
  EXPECT_NO_THROW(validate_manifest(cols, "m.json"));  // empty: overlaps nothing
  cols["tensors"]["w"]["shards"][2]["shape"] = {1, 2};
  EXPECT_NE(error_of([&] { validate_manifest(cols, "m.json"); }).find("overlap"), std::string::npos);
}

TEST(Checkpoint, ShardsAreAssembledIntoAnyBox) {
  TempDir d;
  Comm world("world", 0);
  // One tensor written whole, read back in the boxes a rank of another mesh
  // asks for (shards from several ranks: the multi-rank tests).
  Checkpointer saver({d.path.string(), 2, false}, world);
  at::Tensor w = at::arange(24, at::kFloat).view({6, 4});
  saver.save(1, {{"model/w", w, {6, 4}, {0, 0}, true}}, {{"note", "x"}}, {{"rank", 0}});
  Reader r(*latest(d.path.string()));
  EXPECT_EQ(r.manifest()["note"], "x");
  EXPECT_EQ(r.manifest()["step"], 1);
  at::Tensor box = at::empty({2, 4});
  r.read("model/w", box, {4, 0}, {6, 4});
  EXPECT_TRUE(at::equal(box, w.narrow(0, 4, 2)));
  // A bigger global dim 0 (more vocabulary padding at another tp): rows beyond
  // the stored 6 are zero.
  at::Tensor padded = at::full({8, 4}, 7.0f);
  r.read("model/w", padded, {0, 0}, {8, 4});
  EXPECT_TRUE(at::equal(padded.narrow(0, 0, 6), w));
  EXPECT_EQ(padded.narrow(0, 6, 2).abs().sum().item<float>(), 0.0f);
  // Any other mismatch is an error naming both shapes.
  at::Tensor wrong = at::empty({6, 5});
  EXPECT_NE(error_of([&] { r.read("model/w", wrong, {0, 0}, {6, 5}); }).find("has shape [6, 4], the model expects [6, 5]"),
            std::string::npos);
}

// ZeRO's layout: flat ranges of a tensor written as boxes (several of one
// tensor in one file, told apart by key), read back on another split, whole
// and in boxes, streamed through staging buffers from one element to more
// than the tensor: every way gives the same numbers.
TEST(Checkpoint, FlatRangesRoundTripThroughAnyStaging) {
  TempDir d;
  Comm world("world", 0);
  Checkpointer saver({d.path.string(), 2, false}, world);
  const std::vector<int64_t> shape{4, 5, 6};
  at::Tensor w = at::arange(120, at::kFloat).view(shape);
  at::Tensor flat = w.view({-1});
  std::vector<Piece> pieces;
  for (auto [b, e] : {std::pair<int64_t, int64_t>{0, 37}, {37, 38}, {38, 91}, {91, 120}}) {
    for (const FlatBox& box : flat_range_boxes(shape, b, e)) {
      int64_t n = 1;
      for (int64_t x : box.shape) n *= x;
      pieces.push_back({"model/w", flat.narrow(0, box.start, n).view(box.shape), shape, box.offsets, true});
    }
  }
  ASSERT_GT(pieces.size(), 4u);
  saver.save(1, pieces, nlohmann::json::object(), nlohmann::json::object());
  ASSERT_TRUE(verify(*latest(d.path.string())).problems.empty());
  for (int64_t staging : {4, 28, 100, 1 << 20}) {
    Reader r(*latest(d.path.string()), staging);
    EXPECT_TRUE(at::equal(r.read_full("model/w"), w)) << staging;
    // Another split's ranges, read straight into their slice.
    at::Tensor slice = at::zeros({50});
    for (const FlatBox& box : flat_range_boxes(shape, 30, 80)) {
      int64_t n = 1;
      for (int64_t x : box.shape) n *= x;
      r.read("model/w", slice.narrow(0, box.start - 30, n).view(box.shape), box.offsets, shape);
    }
    EXPECT_TRUE(at::equal(slice, flat.narrow(0, 30, 50))) << staging;
    at::Tensor box = at::empty({2, 3, 4});
    r.read("model/w", box, {1, 2, 1}, shape);
    EXPECT_TRUE(at::equal(box, w.narrow(0, 1, 2).narrow(1, 2, 3).narrow(2, 1, 4))) << staging;
  }
}

TEST(Checkpoint, IncompleteTilingIsRefusedAtSave) {
  TempDir d;
  Comm world("world", 0);
  Checkpointer saver({d.path.string(), 2, false}, world);
  // Only half of the rows: the manifest would describe a tensor nobody wrote.
  const std::string e = error_of([&] { saver.save(1, sharded(0), {}, {}); });
  EXPECT_NE(e.find("shards cover 12 of 24 elements"), std::string::npos) << e;
  EXPECT_FALSE(latest(d.path.string()).has_value());
}

TEST(Checkpoint, CorruptionIsFoundAndRefused) {
  TempDir d;
  Comm world("world", 0);
  Checkpointer saver({d.path.string(), 2, false}, world);
  at::Tensor w = at::randn({16, 16}), b = at::randn({16});
  saver.save(5, {{"model/w", w, {16, 16}, {0, 0}, true}, {"model/b", b, {16}, {0}, true}}, {}, {});
  const std::string dir = *latest(d.path.string());
  EXPECT_TRUE(verify(dir).problems.empty());
  // Flip one byte inside the tensor "model/b".
  const std::string file = dir + "/rank_00000.safetensors";
  std::string all;
  {
    std::ifstream in(file, std::ios::binary);
    all.assign(std::istreambuf_iterator<char>(in), {});
  }
  uint64_t header = 0;
  std::memcpy(&header, all.data(), 8);
  const uint64_t b_begin = SafetensorsFile(file).entries().at("model/b").begin;
  all[8 + header + b_begin + 5] ^= 0x40;
  std::ofstream(file, std::ios::binary | std::ios::trunc) << all;
  const VerifyReport rep = verify(dir);
  ASSERT_EQ(rep.problems.size(), 1u);
  EXPECT_NE(rep.problems[0].find("'model/b'"), std::string::npos) << rep.problems[0];
  Reader r(dir);
  at::Tensor into = at::empty({16});
  const std::string e = error_of([&] { r.read("model/b", into, {0}, {16}); });
  EXPECT_NE(e.find("'model/b'"), std::string::npos) << e;
  EXPECT_NE(e.find("checksum"), std::string::npos) << e;
  at::Tensor ok = at::empty({16, 16});
  r.read("model/w", ok, {0, 0}, {16, 16});  // the intact tensor still loads
  EXPECT_TRUE(at::equal(ok, w));
}

TEST(Checkpoint, TruncatedOrMissingShardIsAClearError) {
  TempDir d;
  Comm world("world", 0);
  Checkpointer saver({d.path.string(), 2, false}, world);
  saver.save(3, {{"model/w", at::randn({64}), {64}, {0}, true}}, {}, {});
  const std::string dir = *latest(d.path.string());
  const std::string file = dir + "/rank_00000.safetensors";
  fs::resize_file(file, fs::file_size(file) - 10);
  std::string e = error_of([&] { Reader r(dir); });
  EXPECT_NE(e.find("rank_00000.safetensors"), std::string::npos) << e;
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;
  EXPECT_FALSE(verify(dir).problems.empty());
  fs::remove(file);
  e = error_of([&] { Reader r(dir); });
  EXPECT_NE(e.find("missing rank_00000.safetensors"), std::string::npos) << e;
  fs::remove(dir + "/manifest.json");
  e = error_of([&] { Reader r(dir); });
  EXPECT_NE(e.find("no manifest.json"), std::string::npos) << e;
}

// A save that fails midway (here: the file size limit, as a full disk would)
// leaves the previous checkpoint intact and no new directory that looks whole.
TEST(Checkpoint, FailedSaveLeavesThePreviousIntact) {
  TempDir d;
  Comm world("world", 0);
  Checkpointer saver({d.path.string(), 2, false}, world);
  at::Tensor small = at::randn({100});
  saver.save(1, {{"model/w", small, {100}, {0}, true}}, {}, {});
  struct sigaction ignore {}, old {};
  ignore.sa_handler = SIG_IGN;
  sigaction(SIGXFSZ, &ignore, &old);
  rlimit before{};
  getrlimit(RLIMIT_FSIZE, &before);
  rlimit limited = before;
  limited.rlim_cur = 64 * 1024;  // the new file stops growing at 64 KiB
  setrlimit(RLIMIT_FSIZE, &limited);
  const std::string e = error_of([&] { saver.save(2, {{"model/w", at::randn({100000}), {100000}, {0}, true}}, {}, {}); });
  setrlimit(RLIMIT_FSIZE, &before);
  sigaction(SIGXFSZ, &old, nullptr);
  EXPECT_NE(e.find("checkpoint step 2 not saved"), std::string::npos) << e;
  EXPECT_NE(e.find("File too large"), std::string::npos) << e;
  const auto l = latest(d.path.string());
  ASSERT_TRUE(l.has_value());
  EXPECT_EQ(fs::path(*l).filename(), "step_00000001");
  EXPECT_FALSE(fs::exists(d.path / "step_00000002"));
  EXPECT_TRUE(verify(*l).problems.empty());
  Reader r(*l);
  EXPECT_TRUE(at::equal(r.read_full("model/w"), small));
  // The next successful save cleans the failed attempt's leftovers.
  saver.save(3, {{"model/w", small, {100}, {0}, true}}, {}, {});
  for (const auto& e2 : fs::directory_iterator(d.path)) {
    EXPECT_EQ(e2.path().filename().string().rfind(".tmp", 0), std::string::npos) << e2.path();
  }
}

// A second job (here: a second Checkpointer, whose lock is another open file
// description) on a directory in use is one error naming the holder, and
// touches nothing; once the first is gone the directory is free again.
TEST(Checkpoint, SecondJobOnTheDirectoryIsOneError) {
  TempDir d;
  Comm world("world", 0);
  auto first = std::make_unique<Checkpointer>(SaveOptions{d.path.string(), 2, false}, world);
  first->save(1, {{"model/w", at::ones({4}), {4}, {0}, true}}, {}, {});
  const std::string e = error_of([&] { Checkpointer second({d.path.string(), 2, false}, world); });
  EXPECT_NE(e.find("is in use by another running job (pid " + std::to_string(getpid())), std::string::npos) << e;
  EXPECT_NE(e.find("give each job its own checkpoint.dir"), std::string::npos) << e;
  EXPECT_TRUE(verify(d / "step_00000001").problems.empty());
  first.reset();
  Checkpointer third({d.path.string(), 2, false}, world);
  third.save(2, {{"model/w", at::ones({4}), {4}, {0}, true}}, {}, {});
  EXPECT_TRUE(fs::exists(d.path / "step_00000002" / "manifest.json"));
}

// What a kill leaves (a temporary directory, a checkpoint renamed for
// deletion, an old copy, a step directory without a manifest) is swept when
// the next job opens the directory; complete checkpoints stay.
TEST(Checkpoint, LeftoversOfCrashedSavesAreSwept) {
  TempDir d;
  Comm world("world", 0);
  {
    Checkpointer saver({d.path.string(), 2, false}, world);
    saver.save(1, {{"model/w", at::ones({4}), {4}, {0}, true}}, {}, {});
  }
  for (const char* junk : {".tmp-step_00000002-1f", ".del-step_00000000-77", ".old-step_00000001", "step_00000003"}) {
    fs::create_directories(d.path / junk);
    std::ofstream(d.path / junk / "rank_00000.safetensors") << "partial";
  }
  Checkpointer saver({d.path.string(), 2, false}, world);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(d.path)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{".lock", "step_00000001"}));
  EXPECT_EQ(fs::path(*latest(d.path.string())).filename(), "step_00000001");
}

// An async writer that fails on a full disk fails the save at the next
// poll (the step after), with the OS's cause; its temporary directory is
// removed, so the space is free again, and the previous checkpoint stays.
// A real full file system (a 1 MiB tmpfs) when this process may mount one,
// else the file size limit.
TEST(Checkpoint, AsyncFailureOnAFullDiskFailsAtThePollAndFreesTheSpace) {
  TempDir d;
  const fs::path mnt = d.path / "small";
  fs::create_directories(mnt);
  const bool tmpfs = std::system(("mount -t tmpfs -o size=1m tmpfs " + mnt.string() + " 2>/dev/null").c_str()) == 0;
  struct Unmount {
    fs::path p;
    bool on;
    ~Unmount() {
      if (on) std::system(("umount " + p.string()).c_str());
    }
  } unmount{mnt, tmpfs};
  Comm world("world", 0);
  auto used = [&] {
    uintmax_t n = 0;
    for (const auto& e : fs::recursive_directory_iterator(mnt)) n += e.is_regular_file() ? e.file_size() : 0;
    return n;
  };
  std::string e;
  {
    Checkpointer saver({(mnt / "ck").string(), 2, true}, world);
    at::Tensor small = at::randn({1000});
    saver.save(1, {{"model/w", small, {1000}, {0}, true}}, {}, {});
    saver.finish();
    const uintmax_t before = used();
    struct sigaction ignore {}, old {};
    ignore.sa_handler = SIG_IGN;
    sigaction(SIGXFSZ, &ignore, &old);
    rlimit lim{};
    getrlimit(RLIMIT_FSIZE, &lim);
    const rlimit unlimited = lim;
    if (!tmpfs) lim.rlim_cur = 256 * 1024;
    setrlimit(RLIMIT_FSIZE, &lim);
    saver.save(2, {{"model/w", at::randn({1 << 19}), {1 << 19}, {0}, true}}, {}, {});  // 2 MiB: does not fit
    int64_t done = -1;
    for (int step = 0; step < 1000 && e.empty() && done < 0; ++step) {
      e = error_of([&] { done = saver.poll(); });
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    setrlimit(RLIMIT_FSIZE, &unlimited);
    sigaction(SIGXFSZ, &old, nullptr);
    EXPECT_EQ(done, -1);
    EXPECT_EQ(used(), before);  // the failed attempt's bytes are gone
  }
  EXPECT_NE(e.find("checkpoint step 2 not saved: rank 0: "), std::string::npos) << e;
  EXPECT_NE(e.find(tmpfs ? "No space left on device" : "File too large"), std::string::npos) << e;
  EXPECT_EQ(fs::path(*latest((mnt / "ck").string())).filename(), "step_00000001");
  for (const auto& x : fs::directory_iterator(mnt / "ck")) {
    EXPECT_EQ(x.path().filename().string().rfind(".tmp", 0), std::string::npos) << x.path();
  }
}

TEST(Checkpoint, KeepsTheNewestKAndAsyncSnapshots) {
  TempDir d;
  Comm world("world", 0);
  Checkpointer saver({d.path.string(), 2, true}, world);
  at::Tensor w = at::zeros({1000});
  for (int step = 1; step <= 4; ++step) {
    w.fill_(static_cast<float>(step));
    saver.save(step, {{"model/w", w, {1000}, {0}, true}}, {}, {});
    w.fill_(-1.0f);  // training moves on at once: the snapshot must hold `step`
  }
  saver.finish();
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(d.path)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{".lock", "step_00000003", "step_00000004"}));
  for (int step : {3, 4}) {
    Reader r((d.path / step_dir_name(step)).string());
    EXPECT_TRUE(at::equal(r.read_full("model/w"), at::full({1000}, static_cast<float>(step))));
  }
}

TEST(Checkpoint, ExportWritesFullWeightsWithoutPadding) {
  TempDir d;
  Comm world("world", 0);
  Checkpointer saver({d.path.string(), 2, false}, world);
  at::Tensor embed = at::randn({8, 4});  // vocab 5 padded to 8
  embed.narrow(0, 5, 3).zero_();
  saver.save(7, {{"model/embed.weight", embed, {8, 4}, {0, 0}, true},
                 {"optim/exp_avg/embed.weight", embed, {8, 4}, {0, 0}, true}},
             {{"config", {{"model", {{"vocab", 5}}}}}}, {});
  const std::string out = d / "model.safetensors";
  export_model(*latest(d.path.string()), out, false);
  SafetensorsFile f(out);
  EXPECT_EQ(f.entries().size(), 1u);  // the model only, no optimizer state
  EXPECT_TRUE(at::equal(f.get("embed.weight"), embed.narrow(0, 0, 5)));
  EXPECT_EQ(f.metadata().at("step"), "7");
  EXPECT_NE(error_of([&] { export_model(*latest(d.path.string()), out, false); }).find("pass --force"),
            std::string::npos);
  export_model(*latest(d.path.string()), out, true);
}

}  // namespace
}  // namespace meshtrain::ckpt
