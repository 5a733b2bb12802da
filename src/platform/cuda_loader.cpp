#include "meshtrain/platform/cuda_loader.h"

#include <dlfcn.h>
#include <unistd.h>

#include <ATen/detail/CUDAHooksInterface.h>
#include <fmt/format.h>

#include <climits>
#include <mutex>
#include <stdexcept>

#include "platform/cuda_api.h"

namespace meshtrain {
namespace {

std::mutex g_mutex;
bool g_tried = false;  // load_cuda_where_a_driver_is() ran
const CudaApi* g_api = nullptr;
std::string g_why = "CUDA not loaded yet";

// The plugin beside the running executable (an installed or copied meshtrain), else where
// this build wrote it (test binaries live one directory below).
std::string plugin_path() {
  char exe[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n > 0) {
    std::string dir(exe, static_cast<size_t>(n));
    dir = dir.substr(0, dir.rfind('/') + 1);
    const std::string beside = dir + "libmeshtrain_cuda.so";
    if (::access(beside.c_str(), R_OK) == 0) return beside;
  }
  return MESHTRAIN_CUDA_PLUGIN;
}

bool load_locked() {
  if (g_api) return true;
  const std::string path = plugin_path();
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (!handle) {
    g_why = fmt::format("the CUDA plugin did not load: {}", ::dlerror());
    return false;
  }
  using Entry = const CudaApi* (*)();
  auto entry = reinterpret_cast<Entry>(::dlsym(handle, "meshtrain_cuda_api"));
  const CudaApi* api = entry ? entry() : nullptr;
  if (!api || api->version != kCudaApiVersion) {
    g_why = fmt::format("{} is from another meshtrain build (rebuild it with this one)", path);
    return false;
  }
  if (!at::detail::getCUDAHooks().hasCUDART()) {
    throw std::logic_error(
        "libtorch's CUDA hooks were looked up before libmeshtrain_cuda.so loaded, so ATen stays CPU-only in "
        "this process: call load_cuda_where_a_driver_is() first in main() (platform/cuda_loader.h)");
  }
  g_api = api;
  g_why.clear();
  return true;
}

}  // namespace

void load_cuda_where_a_driver_is() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_tried) return;
  g_tried = true;
  // The driver library is what a CUDA device needs first; without it nothing CUDA can run.
  if (void* driver = ::dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL)) {
    ::dlclose(driver);
    load_locked();
  } else {
    g_why = "no CUDA driver on this machine (libcuda.so.1 not found), so the CUDA libraries are not loaded";
  }
}

bool load_cuda() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_tried = true;
  return load_locked();
}

bool cuda_loaded() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_api != nullptr;
}

std::string cuda_absence_reason() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_why;
}

const CudaApi* loaded_cuda_api() {
  load_cuda_where_a_driver_is();  // a main() that did not: decide now
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_api;
}

}  // namespace meshtrain
