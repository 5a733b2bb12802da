// The startup memory estimate against what the run measures (train/memory_estimate.h):
// the counting allocator itself, then `meshtrain train` at the demo's shape, at
// the tiny test shapes (seq 32 and 64), and where activations dominate.
//
// Tolerance: the issue's 25 % of the measured peak, for both the resident
// growth above the start point and the tensors' peak. On a 2-core Intel Xeon
// every mesh of docs/bench-memory.md lands at 0.81-1.09x.
#include <gtest/gtest.h>

#include <ATen/Functions.h>
#include <c10/core/CPUAllocator.h>

#include <cstdio>
#include <regex>
#include <string>
#include <vector>

#include "meshtrain/data/shard.h"
#include "meshtrain/platform/tensor_memory.h"
#include "tests/run_command.h"
#include "tests/train_cli.h"
#include "tests/test_paths.h"

namespace meshtrain {
namespace {

using test::Dir;

TEST(TensorMemory, CountsWhatLibtorchAllocatesAndFrees) {
  tensor_memory::install();
  ASSERT_TRUE(tensor_memory::installed());
  const int64_t before = tensor_memory::current_bytes();
  {
    at::Tensor t = at::empty({1000}, at::kFloat);
    EXPECT_EQ(tensor_memory::current_bytes() - before, 4000);
    t.fill_(2);
    EXPECT_EQ(t.sum().item<float>(), 2000);  // the storage is usable memory
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data_ptr()) % 64, 0u);  // the default allocator's alignment
  }
  EXPECT_EQ(tensor_memory::current_bytes(), before);
  tensor_memory::reset_peak();
  { at::Tensor big = at::empty({1 << 20}, at::kByte); }
  EXPECT_GE(tensor_memory::peak_bytes() - before, 1 << 20);
  // Some of ATen's CPU kernels allocate raw: the data pointer must be its own context (a bf16 run and a MoE
  // run stopped on "dptr.get() == dptr.get_context()" with a wrapping context).
  c10::Allocator* a = c10::GetCPUAllocator();
  void* raw = a->raw_allocate(256);
  EXPECT_EQ(tensor_memory::current_bytes() - before, 256);
  a->raw_deallocate(raw);
  EXPECT_EQ(tensor_memory::current_bytes(), before);
  // Resizing copies through the allocator's copy_data.
  at::Tensor r = at::arange(10, at::kFloat);
  r.resize_({1000});
  EXPECT_EQ(r[9].item<float>(), 9);
  // Uninstalled: libtorch's default allocator again; what was counted is still subtracted when freed.
  at::Tensor counted = at::empty({100}, at::kFloat);
  const int64_t with_counted = tensor_memory::current_bytes();
  tensor_memory::uninstall();
  EXPECT_FALSE(tensor_memory::installed());
  EXPECT_EQ(c10::GetCPUAllocator(), c10::GetDefaultCPUAllocator());
  { at::Tensor plain = at::empty({1000}, at::kFloat); }
  EXPECT_EQ(tensor_memory::current_bytes(), with_counted);
  counted = at::Tensor();
  EXPECT_EQ(tensor_memory::current_bytes(), with_counted - 400);
  tensor_memory::install();  // counting again, as the other tests in this process found it
  EXPECT_TRUE(tensor_memory::installed());
}

struct Check {
  double resident = 0, tensors = 0;  // estimated / measured
  double allocator_share = 0;        // the estimate's allocator line / its whole growth
};

// The "memory after step" line's two ratios, and the allocator line of the estimate.
Check check_of(const std::string& out) {
  static const std::regex ratios(R"(memory after step \d+: .*\(estimated [0-9.]+ \w+: ([0-9.]+)x\); tensors at most .*\(estimated [0-9.]+ \w+: ([0-9.]+)x\))");
  static const std::regex lines(R"(resident at start \(measured\)(.*) \((fp32|bf16|fp16), Adam\))");
  static const std::regex item(R"(\+ ([0-9.]+) (B|KiB|MiB|GiB) ([^+]*))");
  std::smatch m;
  Check c;
  if (!std::regex_search(out, m, ratios)) {
    ADD_FAILURE() << "no memory check line in:\n" << out;
    return c;
  }
  c.resident = std::stod(m[1]);
  c.tensors = std::stod(m[2]);
  if (!std::regex_search(out, m, lines)) {
    ADD_FAILURE() << "no estimate line in:\n" << out;
    return c;
  }
  const std::string parts = m[1];
  double total = 0, allocator = 0;
  for (std::sregex_iterator it(parts.begin(), parts.end(), item), end; it != end; ++it) {
    const std::string unit = (*it)[2];
    const double bytes = std::stod((*it)[1]) * (unit == "GiB" ? 1 << 30 : unit == "MiB" ? 1 << 20 : unit == "KiB" ? 1024 : 1);
    total += bytes;
    if (std::string((*it)[3]).rfind("allocator", 0) == 0) allocator = bytes;
  }
  c.allocator_share = total > 0 ? allocator / total : 0;
  return c;
}

std::string corpus(const Dir& d, size_t n) {
  std::vector<uint32_t> tokens(n);
  for (size_t i = 0; i < n; ++i) tokens[i] = static_cast<uint32_t>((i * 7 + i / 13) % 50);
  const std::string path = (d.path / "train.bin").string();
  write_shard(path, tokens, {0}, 2);
  return path;
}

Check run_train(const Dir& d, const std::string& model, const std::string& train, const std::string& parallel) {
  const std::string cfg = d.write("m.toml", "[model]\npreset = \"gpt-tiny\"\ndropout = 0.0\n" + model + "[data]\ntrain = \"" +
                                                corpus(d, 40000) + "\"\n[train]\nsteps = 3\nlog_every = 1\nlr = 1e-3\n" +
                                                train + "[parallel]\n" + parallel);
  const auto run = test::run_command(std::string(MESHTRAIN_BIN) + " train " + cfg);
  EXPECT_EQ(run.code, 0) << run.output;
  return check_of(run.output);
}

void expect_within(const Check& c, const std::string& what) {
  std::printf("%s: estimated / measured resident growth %.2fx, tensors %.2fx\n", what.c_str(), c.resident, c.tensors);
  EXPECT_GE(c.resident, 0.75) << what << ": resident growth";
  EXPECT_LE(c.resident, 1.25) << what << ": resident growth";
  EXPECT_GE(c.tensors, 0.75) << what << ": tensors";
  EXPECT_LE(c.tensors, 1.25) << what << ": tensors";
}

// configs/kjv-tiny.toml's shapes: 4 ranks as tp 2 (sequence parallel) x dp 2.
TEST(MemoryCli, EstimateIsWithinAQuarterAtTheDemoShape) {
  Dir d;
  expect_within(run_train(d, "layers = 4\nhidden = 128\nheads = 4\nffn = 512\nvocab = 4096\n",
                          "micro_batch = 4\nglobal_batch = 16\nseq = 128\n", "tp = 2\nsp = true\nnproc = 4\n"),
                "demo");
}

// The tests' tiny shapes, where the issue measured a 4.4x miss going from seq 32 to 64.
TEST(MemoryCli, EstimateIsWithinAQuarterAtTheTestShapes) {
  for (const char* seq : {"32", "64"}) {
    Dir d;
    expect_within(run_train(d, "layers = 2\nvocab = 64\n",
                            std::string("micro_batch = 2\nglobal_batch = 8\nseq = ") + seq + "\n", "nproc = 2\n"),
                  std::string("seq ") + seq);
  }
}

// ZeRO-3 where the untied embedding and head outweigh the layers (each 8x a
// layer): what is gathered at once is two adjacent units (parallel/data/zero.h),
// the head with the last layer at the start of backward, as the ledger counts.
// With unit 0 (embedding and head together) whole from forward to the end of
// backward, as before 2026-12-06, this measured 0.67x resident, 0.57x tensors.
TEST(MemoryCli, EstimateIsWithinAQuarterUnderZero3WithALargeVocabulary) {
  Dir d;
  expect_within(run_train(d, "layers = 2\nhidden = 128\nheads = 4\nffn = 512\nvocab = 16384\ntied = false\n",
                          "micro_batch = 2\nglobal_batch = 4\nseq = 64\n", "nproc = 2\nzero = 3\n"),
                "zero 3, vocab 16384");
}

// Activations dominate (one process, seq 128 x micro-batch 32, the scores materialised):
// the allocator's line is a third of the estimate, so an estimate without it would miss
// by more than a quarter. With sdpa (auto's choice here) there are no scores and the
// same shape's estimate is within a quarter as well.
TEST(MemoryCli, TheAllocatorIsCountedWhereActivationsDominate) {
  const std::string model = "layers = 4\nhidden = 128\nheads = 4\nffn = 512\nvocab = 4096\n";
  const std::string train = "micro_batch = 32\nglobal_batch = 64\nseq = 128\n";
  Dir d;
  const Check c = run_train(d, model + "attention = \"naive\"\n", train, "nproc = 1\n");
  expect_within(c, "seq 128 x 32, naive");
  EXPECT_LT(c.resident * (1 - c.allocator_share), 0.75) << "the allocator line is not what keeps the estimate within";
  Dir e;
  expect_within(run_train(e, model, train, "nproc = 1\n"), "seq 128 x 32, sdpa");
}

}  // namespace
}  // namespace meshtrain
