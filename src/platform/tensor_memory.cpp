#include "meshtrain/platform/tensor_memory.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <stdexcept>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

namespace meshtrain::tensor_memory {
namespace {

std::atomic<int64_t> g_current{0}, g_peak{0};
std::atomic<bool> g_installed{false};
std::mutex g_switch;  // install() and uninstall()

void add(int64_t n) {
  const int64_t now = g_current.fetch_add(n, std::memory_order_relaxed) + n;
  int64_t peak = g_peak.load(std::memory_order_relaxed);
  while (now > peak && !g_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

// A counted storage: c10's alloc_cpu (the default allocator's, with its alignment) of a header + the
// bytes asked for. The header's last 16 bytes hold the size asked for and the header's length, so the
// deleter finds both from the data pointer alone: the data pointer is its own context, as raw_allocate()
// and raw_deleter() users (some of ATen's CPU kernels) require.
struct Header {
  int64_t bytes;
  int64_t header;
};

void release(void* data) {
  const Header h = *(static_cast<Header*>(data) - 1);
  g_current.fetch_sub(h.bytes, std::memory_order_relaxed);
  c10::free_cpu(static_cast<char*>(data) - h.header);
}

class CountingAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    const size_t header = std::max<size_t>(c10::c10_compute_alignment(n), sizeof(Header));
    char* base = static_cast<char*>(c10::alloc_cpu(n + header));
    void* data = base + header;
    *(static_cast<Header*>(data) - 1) = Header{static_cast<int64_t>(n), static_cast<int64_t>(header)};
    add(static_cast<int64_t>(n));
    return {data, data, &release, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &release; }

  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }
};

}  // namespace

void install() {
  std::lock_guard<std::mutex> lock(g_switch);
  if (g_installed) return;
  // Priority 1 outranks the default CPU allocator's registration (0); the allocator lives for the process
  // (storages it allocated free through it after uninstall()).
  static CountingAllocator counting;
  c10::SetCPUAllocator(&counting, 1);
  g_installed = true;
}

void uninstall() {
  std::lock_guard<std::mutex> lock(g_switch);
  if (!g_installed) return;
  c10::SetCPUAllocator(c10::GetDefaultCPUAllocator(), 1);  // the same priority replaces ours
  if (c10::GetCPUAllocator() != c10::GetDefaultCPUAllocator()) {
    throw std::logic_error("tensor_memory::uninstall: libtorch kept the counting allocator");
  }
  g_installed = false;
}

bool installed() { return g_installed.load(); }
int64_t current_bytes() { return g_current.load(std::memory_order_relaxed); }
int64_t peak_bytes() { return g_peak.load(std::memory_order_relaxed); }
void reset_peak() { g_peak.store(g_current.load(std::memory_order_relaxed), std::memory_order_relaxed); }

}  // namespace meshtrain::tensor_memory
