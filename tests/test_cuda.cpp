// Tests that need a CUDA device: ordinary GoogleTest cases that skip with the reason
// "no CUDA device" on machines without one (tests/allowed_skips.txt names each, and only
// these). scripts/gpu_check.sh runs them where a device is.
#include <gtest/gtest.h>

#include <tuple>

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "meshtrain/nn/fp8.h"
#include "meshtrain/nn/functional.h"
#include "meshtrain/platform/device.h"
#include "meshtrain/train/precision.h"
#include "src/comm/backend.h"
#include "tests/run_command.h"
#include "tests/train_cli.h"
#include "tests/test_paths.h"

namespace meshtrain {
namespace {

#define REQUIRE_CUDA() \
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device"

// The device computes what the CPU computes: a matrix product in fp32 (TF32 off, the default
// for matmul in libtorch) within fp32 reassociation.
TEST(Cuda, MatmulOnTheDeviceEqualsTheCpu) {
  REQUIRE_CUDA();
  at::manual_seed(1);
  const at::Tensor a = at::randn({256, 512}), b = at::randn({512, 128});
  const at::Tensor on_device = at::matmul(a.to(at::kCUDA), b.to(at::kCUDA)).cpu();
  EXPECT_TRUE(at::allclose(on_device, at::matmul(a, b), 1e-5, 1e-4)) << (on_device - at::matmul(a, b)).abs().max();
}

// train.precision = bf16 on a CUDA run: autocast on the CUDA device type, the CPU's left alone.
TEST(Cuda, AutocastGuardCastsOnTheDeviceOnly) {
  REQUIRE_CUDA();
  const at::Tensor a = at::randn({8, 8}), b = at::randn({8, 8});
  AutocastGuard g(Precision::Bf16, c10::DeviceType::CUDA);
  EXPECT_EQ(at::matmul(a.to(at::kCUDA), b.to(at::kCUDA)).scalar_type(), at::kBFloat16);
  EXPECT_EQ(at::matmul(a, b).scalar_type(), at::kFloat);
}

// NCCL at world size 1 (meshtrain's Comm short-cuts a group of one, so the backend is
// called as Comm calls it): all_reduce in place and _allgather_base, fp32 and native bf16.
TEST(Cuda, NcclCollectivesAtWorldSizeOne) {
  REQUIRE_CUDA();
  bind_compute_device(DeviceKind::Cuda, 0);
  auto store = c10::make_intrusive<c10d::HashStore>();
  BackendOptions o;
  o.kind = BackendKind::Nccl;
  auto pg = make_backend(store, 0, 1, o);
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    at::Tensor t = at::arange(16, at::TensorOptions().dtype(dtype).device(at::kCUDA));
    const at::Tensor want = t.cpu();
    std::vector<at::Tensor> v{t};
    pg->allreduce(v)->wait();
    at::Tensor out = at::empty_like(t);
    backend_all_gather_base(*pg, out, t)->wait();
    synchronize_compute_device();
    EXPECT_TRUE(at::equal(t.cpu(), want)) << dtype;
    EXPECT_TRUE(at::equal(out.cpu(), want)) << dtype;
  }
  bind_compute_device(DeviceKind::Cpu, 0);
}

// PyTorch's fused attention on the device (flash / memory-efficient kernels) computes the
// naive path's attention: fp32 within reassociation, grouped-query heads too.
TEST(Cuda, SdpaOnTheDeviceEqualsNaiveAttention) {
  REQUIRE_CUDA();
  at::manual_seed(3);
  const auto o = at::TensorOptions().device(at::kCUDA);
  for (int64_t hkv : {4, 2}) {
    const at::Tensor q = at::randn({2, 4, 64, 32}, o), k = at::randn({2, hkv, 64, 32}, o), v = at::randn({2, hkv, 64, 32}, o);
    const at::Tensor naive = nn::causal_attention(q, k, v), fused = nn::sdpa_causal_attention(q, k, v);
    EXPECT_TRUE(at::allclose(fused, naive, 1e-5, 1e-5)) << (fused - naive).abs().max();
    // bf16: the flash kernel, within bf16 rounding of the fp32 result
    const at::Tensor low = nn::sdpa_causal_attention(q.to(at::kBFloat16), k.to(at::kBFloat16), v.to(at::kBFloat16));
    EXPECT_TRUE(at::allclose(low.to(at::kFloat), naive, 2e-2, 2e-2)) << (low.to(at::kFloat) - naive).abs().max();
  }
}

// Runs `meshtrain train cfg + set`, metrics to `tag` in `d`; returns the metrics path.
std::string train(const test::Dir& d, const std::string& cfg, const std::string& set, const std::string& tag) {
  const std::string metrics = (d.path / tag).string();
  const auto r = test::run_command(std::string(MESHTRAIN_BIN) + " train " + cfg + set + " --set train.metrics='\"" +
                                   metrics + "\"'");
  EXPECT_EQ(r.code, 0) << r.output;
  return metrics;
}

const std::string kOnCuda = " --set train.device='\"cuda\"' --set train.lr=1e-3";

// A CUDA run computes what a CPU run computes: the same weights (drawn on the host), data
// and dropout masks (keyed, made on the host), fp32 without TF32; what differs is the
// order of the device's sums and the fused AdamW kernel's roundings. Tolerances, stated
// before the first device run: loss 1e-5, gradient norm 1e-4 (relative), 6 steps.
TEST(Cuda, TrainingOnTheDeviceEqualsTheCpu) {
  REQUIRE_CUDA();
  test::Dir d;
  const std::string cfg = test::tiny_config(d, "c.toml", "");
  const std::string cpu = train(d, cfg, " --nproc 1 --set train.device='\"cpu\"' --set train.lr=1e-3", "cpu");
  const std::string gpu = train(d, cfg, " --nproc 1" + kOnCuda, "cuda");
  test::expect_close_losses(cpu, gpu, 0, 6, 1e-5, 1e-4);
}

// FP8 on Hopper: at::_scaled_mm's kernel (cuBLASLt) computes what the CPU's emulation of the
// same recipe computes (nn/fp8.h): the same e4m3/e5m2 operands and scales, products accumulated
// in fp32 either way, so forward and both gradients agree within fp32 reassociation.
TEST(Cuda, Fp8LinearOnTheDeviceEqualsTheCpuEmulation) {
  REQUIRE_CUDA();
  at::manual_seed(2);
  const at::Tensor x = at::randn({64, 128}), w = 0.1 * at::randn({96, 128}), dy = 1e-3 * at::randn({64, 96});
  const auto run = [&](c10::Device dev) {
    nn::Fp8Linear l(nn::Fp8Recipe{}, {}, dev);
    const at::Tensor xs = x.to(dev).requires_grad_(true), ws = w.to(dev).requires_grad_(true);
    const at::Tensor y = l.forward(xs, ws);
    y.backward(dy.to(dev));
    return std::vector<at::Tensor>{y.cpu(), xs.grad().cpu(), ws.grad().cpu()};
  };
  const auto cpu = run(at::kCPU), gpu = run(at::Device(at::kCUDA, 0));
  for (size_t i = 0; i < cpu.size(); ++i) {
    const double rel = (gpu[i] - cpu[i]).abs().max().item<double>() / cpu[i].abs().max().item<double>();
    EXPECT_LT(rel, 1e-5) << "output " << i;
  }
}

// FP8 training on the device tracks bf16 on the device (Fp8.TrainsLikeBf16's bound, per step).
TEST(Cuda, Fp8TrainsLikeBf16OnTheDevice) {
  REQUIRE_CUDA();
  test::Dir d;
  const std::string cfg = test::tiny_config(d, "c.toml", "") + " --set model.dropout=0.0";
  const std::string bf16 = train(d, cfg, " --nproc 1 --set train.precision='\"bf16\"'" + kOnCuda, "bf16");
  const std::string fp8 = train(d, cfg, " --nproc 1 --set train.precision='\"fp8\"'" + kOnCuda, "fp8");
  test::expect_close_losses(bf16, fp8, 0, 6, 2e-2, 1.0);
}

// Two ranks on one GPU (NCCL refuses two ranks on one device) with comm.backend = "gloo":
// every collective carries CUDA tensors through host memory (comm.h). DDP, ZeRO-3 and tp 2
// with sequence parallelism each equal one process on the device within fp32 reordering.
TEST(Cuda, TwoRanksShareTheDeviceOverGloo) {
  REQUIRE_CUDA();
  test::Dir d;
  const std::string cfg = test::tiny_config(d, "c.toml", "") + " --set model.dropout=0.0";  // masks differ by data rank
  const std::string one = train(d, cfg, " --nproc 1" + kOnCuda, "one");
  const std::string two = " --nproc 2 --set comm.backend='\"gloo\"'" + kOnCuda;
  test::expect_same_losses(one, train(d, cfg, two, "ddp"), 0, 6);
  test::expect_same_losses(one, train(d, cfg, two + " --set parallel.zero=3", "zero3"), 0, 6);
  test::expect_same_losses(one, train(d, cfg, two + " --set parallel.tp=2 --set parallel.sp=true", "tp2"), 0, 6);
}

// A CUDA run stops, saves from the device, and resumes onto it: the resumed steps equal the
// uninterrupted run's bitwise (the same kernels in the same order).
TEST(Cuda, CheckpointsResumeOnTheDevice) {
  REQUIRE_CUDA();
  test::Dir d;
  const std::string cfg = test::tiny_config(d, "c.toml", "");
  const std::string ck = " --set checkpoint.dir='\"" + (d.path / "ck").string() + "\"' --set checkpoint.every=2";
  const std::string whole = train(d, cfg, " --nproc 1" + kOnCuda, "whole");
  train(d, cfg, " --nproc 1 --set train.stop_after=3" + kOnCuda + ck, "first");
  const std::string rest = train(d, cfg, " --nproc 1" + kOnCuda + ck, "rest");
  const auto a = test::losses(whole), b = test::losses(rest);
  for (const auto& [step, v] : b) {
    ASSERT_TRUE(a.count(step)) << step;
    EXPECT_EQ(a.at(step), v) << "step " << step;
  }
  EXPECT_EQ(b.size(), 3u) << rest;
}

// fp16 with the dynamic loss scaler on the device (the CPU runs it too: parity-matrix row fp16): it trains (finite
// losses, the last below the first) and stays near the fp32 run (fp16's rounding, 1e-2).
TEST(Cuda, Fp16TrainsWithTheLossScaler) {
  REQUIRE_CUDA();
  test::Dir d;
  const std::string cfg = test::tiny_config(d, "c.toml", "");
  const std::string fp32 = train(d, cfg, " --nproc 1" + kOnCuda, "fp32");
  const std::string fp16 = train(d, cfg, " --nproc 1 --set train.precision='\"fp16\"'" + kOnCuda, "fp16");
  const auto a = test::losses(fp32), b = test::losses(fp16);
  ASSERT_EQ(b.size(), 6u) << fp16;
  const double first = std::stod(b.begin()->second), last = std::stod(b.rbegin()->second);
  EXPECT_TRUE(std::isfinite(first) && std::isfinite(last)) << fp16;
  EXPECT_LT(last, first);
  EXPECT_NEAR(last, std::stod(a.rbegin()->second), 1e-2 * last);
}

// ZeRO-Offload (parallel/data/zero.h): with the master slices and Adam's moments in pinned host
// memory and AdamW on the host (the fused CPU update), a ZeRO-1 and a ZeRO-2 run on the device
// train as the device-resident run does within the fp32 tolerance of TrainingOnTheDeviceEqualsTheCpu
// (the CPU's and the device's AdamW round differently); --check-plan holds the moved bytes
// (the host's master, gradient and moment slices, the device's none) against the planner; a
// run stopped and resumed with offload equals the uninterrupted one bitwise.
TEST(Cuda, OffloadTrainsAsTheDeviceResidentRun) {
  REQUIRE_CUDA();
  test::Dir d;
  const std::string cfg = test::tiny_config(d, "c.toml", "") + " --set model.dropout=0.0";
  const std::string two = " --nproc 2 --set comm.backend='\"gloo\"'" + kOnCuda;
  // 24 steps cross the corpus's epoch (22 global batches of 8 windows).
  for (const char* zero : {"1", "2"}) {
    const std::string z = two + " --set parallel.zero=" + zero + " --set train.steps=24";
    const std::string resident = train(d, cfg, z, std::string("resident") + zero);
    const std::string offloaded = train(d, cfg, z + " --set parallel.offload=true", std::string("offload") + zero);
    test::expect_close_losses(resident, offloaded, 0, 24, 1e-5, 1e-4);
  }
  // 16-bit weights on the device (zero.param_dtype = bf16): stage 2 with offload computes what stage 3 in
  // bf16 computes (Zero.OffloadWithBf16ParametersComputesWhatStage3InBf16Computes, bitwise on the CPU); here
  // the host's AdamW and the device's differ in the masters' last fp32 bits, which bf16's rounding of them
  // can carry: loss 1e-3, gradient norm 1e-2 (relative).
  const std::string bf16 = two + " --set train.precision='\"bf16\"' --set zero.param_dtype='\"bf16\"'";
  test::expect_close_losses(train(d, cfg, bf16 + " --set parallel.zero=3", "stage3_bf16"),
                            train(d, cfg, bf16 + " --set parallel.zero=2 --set parallel.offload=true", "offload_bf16"),
                            0, 6, 1e-3, 1e-2);
  // fp16: the loss scaler checks and unscales the host's gradient slices, and a skipped step leaves the
  // host masters alone (bitwise on the CPU: Zero.OffloadWithFp16LossScalingStepsAsTheDeviceResidentRun);
  // fp8: the linears quantise the weights the device holds, the masters stay on the host. Each against
  // the resident run of its precision: fp16 within the bf16 case's bounds, fp8 within the parity
  // matrix's fp8 bounds on dp (2e-3, 3e-2), where one master bit apart can move an e4m3 step.
  for (const auto& [precision, loss_tol, norm_tol] : {std::tuple{"fp16", 1e-3, 1e-2}, std::tuple{"fp8", 2e-3, 3e-2}}) {
    const std::string p = two + " --set parallel.zero=2 --set train.precision='\"" + precision + "\"'";
    test::expect_close_losses(train(d, cfg, p, std::string("resident_") + precision),
                              train(d, cfg, p + " --set parallel.offload=true", std::string("offload_") + precision),
                              0, 6, loss_tol, norm_tol);
  }
  const std::string off = two + " --set parallel.zero=2 --set parallel.offload=true";
  const auto r = test::run_command(std::string(MESHTRAIN_BIN) + " train " + cfg + off +
                                   " --check-plan --set train.stop_after=1");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("host: master, gradient, moments"), std::string::npos) << r.output;
  const std::string ck = " --set checkpoint.dir='\"" + (d.path / "ck").string() + "\"' --set checkpoint.every=2";
  const std::string steps = " --set train.steps=24";  // as offload2's run: the resumed steps 4-24 cross the epoch
  train(d, cfg, off + steps + " --set train.stop_after=3" + ck, "first");
  const auto a = test::losses((d.path / "offload2").string()),
             b = test::losses(train(d, cfg, off + steps + ck, "rest"));
  ASSERT_EQ(b.size(), 21u);
  for (const auto& [step, v] : b) EXPECT_EQ(a.at(step), v) << "step " << step;
}

// The log line's peak memory is the CUDA caching allocator's, on the bound device.
TEST(Cuda, TheLogNamesTheDeviceAndItsPeakMemory) {
  REQUIRE_CUDA();
  test::Dir d;
  const std::string cfg = test::tiny_config(d, "c.toml", "");
  const auto r = test::run_command(std::string(MESHTRAIN_BIN) + " train " + cfg + " --nproc 1" + kOnCuda);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("device cuda"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("on cuda:0"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("GEMM rate of NVIDIA"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace meshtrain
