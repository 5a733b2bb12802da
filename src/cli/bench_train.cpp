// meshtrain bench train: single-process training steps through the trainer
// (TokenLoader + TrainStep + meshtrain's AdamW) against a bare libtorch loop
// over the same model and optimizer (random tokens already in memory,
// loss.mean(), backward, AdamW::update): the difference is the trainer's own
// work. Both interleaved in one process, or (--loop) one of them alone with
// the process's peak resident memory (bench/train.sh runs each in its own
// process beside PyTorch eager).
#include <CLI/CLI.hpp>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/profiler_legacy.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>

#include "cli/commands.h"
#include "meshtrain/comm/comm.h"
#include "meshtrain/data/shard.h"
#include "meshtrain/model/transformer.h"
#include "meshtrain/optim/adamw.h"
#include "meshtrain/parallel/data/zero.h"
#include "meshtrain/plan/count.h"
#include "meshtrain/platform/device.h"
#include "meshtrain/platform/threads.h"
#include "meshtrain/train/fp8_training.h"
#include "meshtrain/train/gemm_peak.h"
#include "meshtrain/train/memory.h"
#include "meshtrain/train/step.h"

namespace meshtrain::cli {

void add_bench_train(CLI::App* bench, std::vector<std::pair<CLI::App*, Run>>& runs) {
  struct Opts {
    std::string model = "gpt2-124m", precision = "fp32", recompute = "none", loop = "both", profile, device = "cpu";
    std::string attention, fp8_scaling = "current";
    int64_t micro_batch = 4, seq = 256;
    int steps = 2, rounds = 3, warmup = 1;
    bool offload = false;
  };
  auto o = std::make_shared<Opts>();
  auto cmd = bench->add_subcommand("train", "training steps: the trainer vs a bare libtorch loop on the same model");
  cmd->add_option("--model", o->model, "model preset")->capture_default_str();
  cmd->add_option("--micro-batch", o->micro_batch, "sequences per step")->capture_default_str();
  cmd->add_option("--seq", o->seq, "sequence length")->capture_default_str();
  cmd->add_option("--precision", o->precision, "fp32 | bf16 | fp8 (blocks' linears in FP8, the rest bf16)")
      ->capture_default_str();
  cmd->add_option("--fp8-scaling", o->fp8_scaling, "current | delayed (with --precision fp8)")->capture_default_str();
  cmd->add_option("--device", o->device, "cpu | cuda (cuda:0; MFU against this device's measured GEMM rate)")
      ->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
  cmd->add_option("--attention", o->attention, "naive | tiled | sdpa | auto (default: the preset's)");
  cmd->add_option("--recompute", o->recompute, "none | selective | full (both sides)")->capture_default_str();
  cmd->add_option("--steps", o->steps, "timed steps per round and side")->capture_default_str();
  cmd->add_option("--rounds", o->rounds, "rounds (sides alternate who goes first)")->capture_default_str();
  cmd->add_option("--warmup", o->warmup, "untimed steps per side")->capture_default_str();
  cmd->add_option("--profile", o->profile,
                  "with --loop trainer|bare: write the timed steps' ATen operations as a Chrome trace to this file "
                  "(libtorch's legacy profiler; bench/profile_ops.py sums them by operation)");
  cmd->add_option("--loop", o->loop, "both | trainer | bare (one alone: prints its peak resident memory)")
      ->check(CLI::IsMember({"both", "trainer", "bare"}))->capture_default_str();
  cmd->add_flag("--offload", o->offload,
                "with --loop trainer: ZeRO-2 over this one rank with the optimizer offloaded to host memory "
                "(parallel.offload, parallel/data/zero.h; bf16: with bf16 parameters on the device)");
  runs.emplace_back(cmd, [o]() {
    if (o->micro_batch < 1 || o->seq < 1 || o->steps < 1 || o->rounds < 1 || o->warmup < 0) {
      throw std::invalid_argument("--micro-batch, --seq, --steps and --rounds must be positive, --warmup >= 0");
    }
    const Precision precision = parse_train_precision(o->precision);
    const DeviceKind device = resolve_device(parse_device(o->device), cuda_device_count(), 1);
    bind_compute_device(device, 0);
    if (precision == Precision::Fp16) {
      throw std::invalid_argument("bench train runs fp32, bf16 or fp8 (fp16 needs a loss scaler)");
    }
    if (o->offload && o->loop != "trainer") throw std::invalid_argument("--offload times the trainer: add --loop trainer");
    const nn::Fp8Recipe recipe{nn::parse_fp8_scaling(o->fp8_scaling), 16, 0};
    configure_threads(1);
    // The MFU denominator as `meshtrain train` takes it: the run dtype's GEMM rate measured before the
    // model exists, on all cores (train/gemm_peak.h); on CUDA the device's, after the timed steps.
    // fp8: against the bf16 rate, as the anchors quote FP8 runs' MFU.
    const bool bf16 = precision == Precision::Bf16 || precision == Precision::Fp8;
    const int cores = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
    HostPeak host;
    if (device == DeviceKind::Cpu) {
      host = measure_host_peak(bf16 ? "gemm_bf16" : "gemm_fp32", cores);
      for (const std::string& w : host.warnings) fmt::print(stderr, "meshtrain: warning: {}\n", w);
    }
    plan::ModelSpec spec = plan::preset(o->model);
    if (!o->attention.empty()) spec.attention = plan::parse_attention(o->attention);
    spec.dropout = 0;
    spec.seq = std::max(spec.seq, o->seq);
    Comm solo("solo", 0);
    // Data: random tokens, as a shard for the trainer and as tensors for the bare loop.
    const std::string shard = (std::filesystem::temp_directory_path() /
                               fmt::format("meshtrain_bench_train_{}.bin", getpid())).string();
    const int64_t windows = 64 * o->micro_batch;
    at::Tensor all = at::randint(spec.vocab, {windows * o->seq + 1}, at::make_generator<at::CPUGeneratorImpl>(1), at::kLong);
    {
      std::vector<uint32_t> tokens(all.data_ptr<int64_t>(), all.data_ptr<int64_t>() + all.numel());
      write_shard(shard, tokens, {0}, spec.vocab < 65536 ? 2 : 4);
    }
    struct Cleanup {
      std::string path;
      ~Cleanup() { std::filesystem::remove(path); }
    } cleanup{shard};
    AdamWOptions ao;
    ao.lr = 1e-4;
    ao.schedule = LrSchedule::Constant;
    ao.clip_norm = 0;  // the bare loop does not clip
    const bool want_trainer = o->loop != "bare", want_bare = o->loop != "trainer";
    // The trainer.
    std::optional<Transformer> model, bare;
    std::optional<AdamW> opt, bare_opt;
    std::optional<TrainStep> trainer;
    std::optional<TokenLoader> loader;
    std::optional<Fp8Training> fp8, bare_fp8;  // fp8: each model's linears and their scaling state
    std::optional<ShardedDataParallel> offloaded;
    if (want_trainer) {
      model.emplace(spec, solo, false, 1);
      if (precision == Precision::Fp8) fp8.emplace(recipe, std::vector<Transformer*>{&*model}, solo, solo);
      model->set_recompute(plan::parse_recompute(o->recompute));
      if (o->offload) {
        ZeroOptions zo{2};
        zo.offload = true;
        zo.bf16_params = precision == Precision::Bf16;  // 16-bit weights on the device, as DeepSpeed keeps them
        offloaded.emplace(*model, solo, solo, solo, ao, zo);
      }
      opt.emplace(offloaded ? offloaded->shard_params() : model->params().params(), ao);
      trainer.emplace(*model, *opt, solo, solo,
                      StepOptions{precision, nullptr, nullptr, offloaded ? &*offloaded : nullptr});
      loader.emplace(std::vector<std::string>{shard}, o->seq, o->micro_batch, 0, 1, 1);
    }
    // The bare loop over an identical model and optimizer.
    if (want_bare) {
      bare.emplace(spec, solo, false, 1);
      if (precision == Precision::Fp8) bare_fp8.emplace(recipe, std::vector<Transformer*>{&*bare}, solo, solo);
      bare->set_recompute(plan::parse_recompute(o->recompute));
      bare_opt.emplace(bare->params().params(), ao);
    }
    int64_t cursor = 0;
    auto bare_step = [&]() {
      const int64_t n = o->micro_batch * o->seq;
      at::Tensor window = all.narrow(0, (cursor % 64) * n, n + 1);
      ++cursor;
      at::Tensor tokens = window.narrow(0, 0, n).view({o->micro_batch, o->seq}).to(compute_device());
      at::Tensor targets = window.narrow(0, 1, n).view({o->micro_batch, o->seq}).to(compute_device());
      for (auto& p : bare->params().params()) p.tensor.mutable_grad() = at::Tensor();
      at::Tensor loss;
      {
        AutocastGuard autocast(precision);  // nothing for fp32
        loss = bare->forward(tokens, targets).mean();
      }
      loss.backward();
      bare_opt->update(0.0);
      if (bare_fp8) bare_fp8->end_step(solo, solo);
      synchronize_compute_device();
    };
    auto trainer_step = [&]() {
      trainer->run({loader->next()});
      if (fp8) fp8->end_step(solo, solo);
      synchronize_compute_device();  // the update is queued after the step's last host read
    };
    for (int i = 0; i < o->warmup; ++i) {
      if (want_trainer) trainer_step();
      if (want_bare) bare_step();
    }
    std::vector<double> t_trainer, t_bare;
    if (!o->profile.empty() && o->loop == "both") throw std::invalid_argument("--profile needs --loop trainer or bare");
    std::optional<torch::autograd::profiler::RecordProfile> profile;
    if (!o->profile.empty()) profile.emplace(o->profile);
    for (int r = 0; r < o->rounds; ++r) {
      for (bool ours : {r % 2 == 0, r % 2 != 0}) {
        if (ours ? !want_trainer : !want_bare) continue;
        for (int i = 0; i < o->steps; ++i) {
          const auto t0 = std::chrono::steady_clock::now();
          ours ? trainer_step() : bare_step();
          (ours ? t_trainer : t_bare).push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        }
      }
    }
    profile.reset();
    const double tokens = static_cast<double>(o->micro_batch * o->seq);
    const bool cuda = computes_on_cuda();
    const double peak_mem = cuda ? static_cast<double>(peak_device_bytes()) : peak_rss_bytes();
    // MFU: the planner's FLOPs per token (6N + attention) over this device's GEMM rate, measured now
    // (after the timed steps, on the same threads), never a best-ever (train/gemm_peak.h).
    const double flops_per_token = plan::train_flops_per_token(spec, o->seq);
    const std::string gemm = std::string(cuda ? "cuda_gemm_" : "gemm_") + (bf16 ? "bf16" : "fp32");
    HostPeak peak = host;
    peak.source = fmt::format("measured before the model was built on all {} cores in {:.2f} s", cores, host.seconds);
    if (cuda) {
      peak.value = measure_cuda_gemm_flops(bf16);
      peak.source = "this device's, measured after the timed steps";
    }
    auto mfu = [&](double s_per_step) { return flops_per_token * tokens / s_per_step / peak.value; };
    fmt::print("shape: {}\n", torch_gpt_shape(spec));
    if (o->loop != "both") {
      const double t = median(want_trainer ? t_trainer : t_bare);
      fmt::print("{} {} on {}: {:.3f} s/step, {:.0f} tokens/s, MFU {:.1f}% ({:.1f} TFLOP/s {} GEMM peak, {}), peak {} "
                 "memory {:.0f} MiB\n",
                 spec.name, o->offload ? "trainer (optimizer offloaded)" : o->loop, compute_device_name(), t, tokens / t, 100 * mfu(t), peak.value / 1e12, gemm,
                 peak.source, cuda ? "device" : "resident", peak_mem / (1 << 20));
      // seconds per step, peak bytes, MFU, the GEMM peak (FLOP/s), the pre-start measurement's seconds
      fmt::print("RESULT {:.6f} {:.0f} {:.6f} {:.6g} {:.3f}\n", t, peak_mem, mfu(t), peak.value, peak.seconds);
      return 0;
    }
    const double a = median(t_trainer), b = median(t_bare);
    fmt::print("{} ({} parameters), micro-batch {} x seq {}, {}, recompute {}, {} threads; {} rounds x {} steps each\n",
               spec.name, model->params().local_numel(), o->micro_batch, o->seq, o->precision, o->recompute,
               threads_per_rank(1), o->rounds, o->steps);
    fmt::print("{:<36} {:>14} {:>12}\n", "loop", "s/step (median)", "tokens/s");
    fmt::print("{:<36} {:>14.3f} {:>12.0f}\n", "bare loop (forward, backward, AdamW)", b, tokens / b);
    fmt::print("{:<36} {:>14.3f} {:>12.0f}\n", "meshtrain trainer", a, tokens / a);
    fmt::print("trainer overhead: {:+.1f}% (time ratio {:.3f})\n", 100 * (a / b - 1), a / b);
    fmt::print("on {}: trainer MFU {:.1f}%, bare MFU {:.1f}% ({:.1f} TFLOP/s {} GEMM peak), peak {} memory {:.0f} MiB\n",
               compute_device_name(), 100 * mfu(a), 100 * mfu(b), peak.value / 1e12, gemm, cuda ? "device" : "resident",
               peak_mem / (1 << 20));
    return 0;
  });
}

}  // namespace meshtrain::cli
