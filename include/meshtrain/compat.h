// Every difference between libtorch versions that meshtrain touches lives here, and only here.
//
// meshtrain builds against libtorch 2.11 (the C++ half of PyPI's torch 2.11.0+cu130 wheel:
// CUDA 13.0, NCCL 2.28.9; scripts/torch_env.sh). The libtorch 1.13 path (Debian's
// libtorch-dev, CPU only) was dropped: a second build that CI does not run would rot.
// Versions from 2.4 on are accepted (the device-type autocast switches, c10d::Backend,
// Gloo with bf16) but only 2.11 is tested.
//
// Gloo headers: the wheel ships gloo's symbols (in libtorch_cpu) but not the headers that
// ProcessGroupGloo.hpp includes; Debian's libgloo-dev (0.0~git20220518) supplies them. They
// are older than the gloo inside the wheel, so meshtrain uses gloo only through types those
// headers declare the same way: ProcessGroupGloo's Options, and devices as
// std::shared_ptr<gloo::transport::Device> made by ProcessGroupGloo's own factories
// (comm/backend.cpp). No gloo object is constructed or laid out by meshtrain's code.
#pragma once

#include <torch/csrc/api/include/torch/version.h>

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

static_assert(TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4),
              "meshtrain needs libtorch >= 2.4 (tested: 2.11); run scripts/setup.sh");

namespace c10d {
// ProcessGroupGloo / ProcessGroupNCCL derive from c10d::Backend and are called directly.
class Backend;
class Store;
}  // namespace c10d

namespace meshtrain {

using PGBackend = c10d::Backend;

// Which collective library a group runs on; decides which gaps Comm fills itself.
enum class BackendKind { Gloo, Nccl };

// Gloo has bf16 collectives, AVG and _allgather_base from libtorch 2.2 (PLATFORM.md).
constexpr bool kGlooHasBf16 = true;

// Autocast's switch and dtype for one device type. libtorch >= 2.4 spells them
// set_autocast_enabled(device_type, on) / set_autocast_dtype(device_type, dtype); the
// CPU-only forms of 1.13 are deprecated. (Defined in src/platform/compat.cpp.)
struct AutocastSwitch {
  bool enabled = false;
  c10::ScalarType dtype = c10::ScalarType::BFloat16;
};
AutocastSwitch autocast_switch(c10::DeviceType device);
void set_autocast_switch(c10::DeviceType device, AutocastSwitch s);

// Autocast off (CPU and CUDA) for a scope that computes in fp32 by design and
// mixes in-place and out-of-place ops (autocast casts only the latter): the
// tiled and ring attention kernels under train.precision = bf16.
class AutocastOff {
 public:
  AutocastOff();
  ~AutocastOff();
  AutocastOff(const AutocastOff&) = delete;
  AutocastOff& operator=(const AutocastOff&) = delete;

 private:
  AutocastSwitch cpu_, cuda_;
};

}  // namespace meshtrain
