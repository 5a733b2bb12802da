// The device a run computes on (platform/device.h) and the CUDA build itself: its CUDA half
// loads on demand (platform/cuda_loader.h), and a CUDA run that cannot be placed is one error
// before any rank starts.
#include <gtest/gtest.h>
#include <link.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include <ATen/Context.h>

#include "meshtrain/platform/cuda_loader.h"
#include "meshtrain/platform/device.h"
#include "meshtrain/train/exposed_comm.h"
#include "meshtrain/train/trainer.h"
#include "src/comm/backend.h"
#include "tests/train_cli.h"
#include "tests/test_paths.h"

namespace meshtrain {
namespace {

std::string resolve_error(DeviceRequest r, int devices, int ranks_per_node) {
  try {
    resolve_device(r, devices, ranks_per_node);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(Device, ParsesTheThreeValuesAndNamesAWrongOne) {
  EXPECT_EQ(parse_device("cpu"), DeviceRequest::Cpu);
  EXPECT_EQ(parse_device("cuda"), DeviceRequest::Cuda);
  EXPECT_EQ(parse_device("auto"), DeviceRequest::Auto);
  EXPECT_THROW(parse_device("gpu"), std::invalid_argument);
  test::Dir d;
  const std::string cfg = test::tiny_config(d, "c.toml", "");
  EXPECT_NE(test::error_of(cfg, {"train.device=\"gpu\""}).find("train.device 'gpu' unknown; use cpu, cuda or auto"),
            std::string::npos)
      << test::error_of(cfg, {"train.device=\"gpu\""});
}

TEST(Device, CpuAndAutoWithoutADeviceAreTheCpu) {
  EXPECT_EQ(resolve_device(DeviceRequest::Cpu, 0, 4), DeviceKind::Cpu);
  EXPECT_EQ(resolve_device(DeviceRequest::Cpu, 8, 16), DeviceKind::Cpu);  // cpu asks for no device
  EXPECT_EQ(resolve_device(DeviceRequest::Auto, 0, 4), DeviceKind::Cpu);
}

TEST(Device, CudaWithoutADeviceNamesTheFix) {
  const std::string e = resolve_error(DeviceRequest::Cuda, 0, 1);
  EXPECT_NE(e.find("train.device = \"cuda\" but this machine has no CUDA device"), std::string::npos) << e;
  EXPECT_NE(e.find("use train.device = \"cpu\""), std::string::npos) << e;
}

TEST(Device, MoreRanksOnANodeThanDevicesNamesTheCount) {
  const std::string e = resolve_error(DeviceRequest::Cuda, 2, 4);
  EXPECT_NE(e.find("4 ranks per node but this node has 2 CUDA devices"), std::string::npos) << e;
  EXPECT_NE(e.find("start at most 2 ranks per node"), std::string::npos) << e;
  const std::string one = resolve_error(DeviceRequest::Cuda, 1, 2);
  EXPECT_NE(one.find("2 ranks per node but this node has 1 CUDA device;"), std::string::npos) << one;
}

// comm.backend = "gloo" lets ranks share a device (collectives through host memory).
TEST(Device, GlooLetsRanksShareADevice) {
  EXPECT_EQ(resolve_device(DeviceRequest::Cuda, 1, 2, true), DeviceKind::Cuda);
  EXPECT_NE(resolve_error(DeviceRequest::Cuda, 1, 2).find("set comm.backend = \"gloo\" to share devices"),
            std::string::npos);
}

TEST(Device, CommBackendIsNamedAndChecked) {
  test::Dir d;
  const std::string cfg = test::tiny_config(d, "c.toml", "");
  EXPECT_NE(test::error_of(cfg, {"comm.backend=\"mpi\""}).find("comm.backend 'mpi' unknown; use auto, nccl or gloo"),
            std::string::npos)
      << test::error_of(cfg, {"comm.backend=\"mpi\""});
  const TrainConfig c = load_train_config(cfg, {"comm.backend=\"nccl\"", "train.device=\"cpu\""});
  try {
    check_run(c, 2, 2, false, false);
    ADD_FAILURE() << "nccl on cpu accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("comm.backend = \"nccl\" carries CUDA tensors"), std::string::npos) << e.what();
  }
}

// The planner's device for the step log's exposed communication (train/exposed_comm.h): the
// preset a CUDA device's name contains, the longest; this host measured on cpu; none otherwise.
TEST(Device, ThePlannersDeviceIsThePresetTheNameContains) {
  EXPECT_EQ(run_device_spec(true, "NVIDIA H200", 0, 0, 1)->name, "h200");
  EXPECT_EQ(run_device_spec(true, "NVIDIA A100-SXM4-80GB", 0, 0, 1)->name, "a100");
  EXPECT_FALSE(run_device_spec(true, "NVIDIA GeForce RTX 4090", 0, 0, 1).has_value());
  const plan::GpuSpec cpu = *run_device_spec(false, "cpu", 200e9, 10e9, 2);
  EXPECT_EQ(cpu.name, "cpu");
  EXPECT_DOUBLE_EQ(cpu.peak_flops, 100e9);  // each of the 2 ranks its share
  const std::string line = exposed_comm_text({{"dp", 0.004}, {"tp", 0.012}, {"pp", 0}}, 0.148, {{"tp", 0.010}});
  EXPECT_EQ(line, "exposed communication: dp 0.004 s (2.7%), tp 0.012 s (8.1%; plan 0.010 s) of the step's 0.148 s");
}

// ZeRO-Offload moves a GPU's optimizer states to the host: on a cpu run it is refused in the
// launching process, with ZeRO-3 or without ZeRO at config time (zero.h builds stages 1 and 2).
TEST(Device, OffloadIsRefusedOnCpuAndOutsideZeroOneAndTwo) {
  test::Dir d;
  const std::string cfg = test::tiny_config(d, "c.toml", "");
  EXPECT_NE(test::error_of(cfg, {"parallel.offload=true", "parallel.zero=3"}).find("parallel.zero is 3: set parallel.zero = 1 or 2"),
            std::string::npos);
  const TrainConfig c = load_train_config(cfg, {"parallel.offload=true", "parallel.zero=2", "train.device=\"cpu\""});
  try {
    check_run(c, 2, 2, false, false);
    ADD_FAILURE() << "offload on cpu accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("this run computes on cpu, where they are in host memory already"),
              std::string::npos)
        << e.what();
  }
}

// model.attention = "sdpa" computes plain causal attention without dropout: a document mask,
// cp or dropout with it is one config error (it used to ignore a document mask silently).
TEST(Device, SdpaRefusesWhatItCannotCompute) {
  test::Dir d;
  const std::string cfg = test::tiny_config(d, "c.toml", "");
  EXPECT_EQ(test::error_of(cfg, {"model.attention=\"sdpa\"", "model.dropout=0"}), "");
  for (const auto& set : std::vector<std::vector<std::string>>{
           {"model.attention=\"sdpa\""},
           {"model.attention=\"sdpa\"", "model.dropout=0", "train.document_mask=true"},
           {"model.attention=\"sdpa\"", "model.dropout=0", "parallel.cp=2"}}) {
    const std::string e = test::error_of(cfg, set);
    EXPECT_NE(e.find("model.attention = \"sdpa\" is plain causal attention without dropout"), std::string::npos)
        << set.back() << ": " << e;
  }
}

// What a CUDA run cannot compute yet is one error naming it, checkable without a device.
TEST(Device, CudaRefusesWhatRunsOnCpuOnlyByName) {
  test::Dir d;
  const std::string cfg = test::tiny_config(d, "c.toml", "");
  EXPECT_NO_THROW(check_cuda_run(load_train_config(cfg, {})));
  EXPECT_NO_THROW(check_cuda_run(load_train_config(cfg, {"parallel.zero=3"})));
  for (const auto& [set, named] : std::vector<std::pair<std::string, std::string>>{
           {"parallel.pp=2", "parallel.pp = 2"},
           {"parallel.cp=2", "parallel.cp = 2"},
           {"model.attention=\"tiled\"", "model.attention = \"tiled\" (a CPU kernel)"}}) {
    try {
      check_cuda_run(load_train_config(cfg, {set, "model.dropout=0"}));
      ADD_FAILURE() << set << " accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(named + " runs on cpu only for now"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("use train.device = \"cpu\""), std::string::npos) << e.what();
    }
  }
}

// FP8 on CUDA: cuBLASLt's FP8 GEMM takes multiples of 16, checked before any rank starts.
// gpt-tiny (hidden 128, ffn 512, 4 heads) at micro-batch 2 x seq 32 fits; seq 36 (72 rows) does not.
TEST(Device, CudaFp8NamesASizeItsGemmCannotTake) {
  test::Dir d;
  const std::string cfg = test::tiny_config(d, "c.toml", "");
  EXPECT_NO_THROW(check_cuda_run(load_train_config(cfg, {"train.precision=\"fp8\""})));
  EXPECT_NO_THROW(check_cuda_run(load_train_config(cfg, {"train.precision=\"bf16\"", "train.seq=36"})));
  try {
    check_cuda_run(load_train_config(cfg, {"train.precision=\"fp8\"", "train.seq=36"}));
    ADD_FAILURE() << "seq 36 accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("train.micro_batch x train.seq is 72, and CUDA's FP8 GEMM needs multiples of 16"),
              std::string::npos)
        << e.what();
  }
}

bool mapped(const std::string& library) {
  std::string loaded;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* out) {
        *static_cast<std::string*>(out) += std::string(info->dlpi_name) + "\n";
        return 0;
      },
      &loaded);
  return loaded.find(library) != std::string::npos;
}

// In a fresh process (the death test's child starts from main()): where main() found no driver,
// no CUDA library is mapped; load_cuda() then maps libtorch_cuda, c10_cuda and NCCL, and the
// NCCL backend is available. `aten_first`: an ATen call that looks up the CUDA hooks
// (at::manual_seed) before the load, which load_cuda() must refuse. Exit codes name what failed.
[[noreturn]] void load_in_a_fresh_process(bool aten_first) {
  if (aten_first) at::manual_seed(0);
  if (!cuda_loaded() && (mapped("libtorch_cuda.so") || mapped("libnccl.so"))) std::_Exit(2);
  try {
    if (!load_cuda()) {
      std::fprintf(stderr, "%s\n", cuda_absence_reason().c_str());
      std::_Exit(3);
    }
  } catch (const std::logic_error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    std::_Exit(4);
  }
  const bool all = mapped("libtorch_cuda.so") && mapped("libc10_cuda.so") && mapped("libnccl.so");
  std::_Exit(all && backend_available(BackendKind::Nccl) ? 0 : 5);
}

// The build has a CUDA half (libtorch_cuda and NCCL behind libmeshtrain_cuda.so), loaded on
// demand: here, with no driver, a process maps none of it until load_cuda().
TEST(Device, TheCudaHalfLoadsOnDemandBeforeAnyAtenCall) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(load_in_a_fresh_process(false), testing::ExitedWithCode(0), "");
  if (!cuda_loaded()) {  // no driver: main() left it to load_cuda()
    EXPECT_NE(cuda_absence_reason().find("no CUDA driver"), std::string::npos) << cuda_absence_reason();
    EXPECT_FALSE(backend_available(BackendKind::Nccl));
    EXPECT_EXIT(load_in_a_fresh_process(true), testing::ExitedWithCode(4),
                "looked up before libmeshtrain_cuda.so loaded");
  }
}

// Through the CLI: the launching process refuses, no rank starts.
TEST(Device, CudaRunWithoutADeviceIsOneErrorBeforeAnyRankStarts) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a CUDA device is present: this checks a machine without one";
  test::Dir d;
  const std::string cfg = test::tiny_config(d, "c.toml", "");
  const auto run = test::run_command(std::string(MESHTRAIN_BIN) + " train " + cfg + " --set train.device='\"cuda\"'");
  EXPECT_EQ(run.code, 1) << run.output;
  EXPECT_NE(run.output.find("train.device = \"cuda\" but this machine has no CUDA device"), std::string::npos)
      << run.output;
  if (!cuda_loaded()) EXPECT_NE(run.output.find("libcuda.so.1 not found"), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find("[rank"), std::string::npos) << "ranks were started\n" << run.output;
}

}  // namespace
}  // namespace meshtrain
