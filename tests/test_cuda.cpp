// Tests that need a CUDA device: ordinary GoogleTest cases that skip with the reason
// "no CUDA device" on machines without one (tests/allowed_skips.txt names each, and only
// these). scripts/gpu_check.sh runs them where a device is.
#include <gtest/gtest.h>

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "meshtrain/runtime/device.h"
#include "meshtrain/train/precision.h"
#include "src/comm/backend.h"

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
  c10::cuda::set_device(0);
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
    c10::cuda::device_synchronize();
    EXPECT_TRUE(at::equal(t.cpu(), want)) << dtype;
    EXPECT_TRUE(at::equal(out.cpu(), want)) << dtype;
  }
}

}  // namespace
}  // namespace meshtrain
