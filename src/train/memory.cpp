#include "meshtrain/train/memory.h"

#include <sys/resource.h>

#include <fmt/format.h>
#include <algorithm>
#include <stdexcept>
#include <string>
#include <fstream>
#include <atomic>

#include <set>

#include "meshtrain/optim/adamw.h"
#include "meshtrain/parallel/data/ddp.h"
#include "meshtrain/parallel/data/zero.h"
#include "meshtrain/plan/memory.h"

namespace meshtrain {
namespace {

// Sums the bytes of storages not seen before.
struct StorageBytes {
  std::set<const void*> seen;
  int64_t add(const at::Tensor& t) {
    if (!t.defined() || !seen.insert(t.storage().unsafeGetStorageImpl()).second) return 0;
    return static_cast<int64_t>(t.storage().nbytes());
  }
};

}  // namespace

MemoryUse measure_memory(const std::vector<Param>& params, AdamW& opt, const DataParallel* ddp,
                         const std::vector<ShardedDataParallel*>& zero) {
  MemoryUse m;
  StorageBytes seen;
  std::vector<const Param*> all, host;
  for (const auto& p : params) all.push_back(&p);
  bool offloaded = false;  // one engine offloads all of its ZeRO wrappers or none
  for (ShardedDataParallel* z : zero) {
    if (!z) continue;
    offloaded = offloaded || z->offloaded();
    for (const auto& p : z->shard_params()) (z->offloaded() ? host : all).push_back(&p);
  }
  for (const Param* p : all) {
    const int64_t b = seen.add(p->tensor);
    m.params += b;
    if (p->frozen) m.frozen += b;
  }
  for (const Param* p : all) m.grads += seen.add(p->tensor.grad());
  for (ShardedDataParallel* z : zero) {
    if (z) for (const at::Tensor& g : z->device_gradients()) m.grads += seen.add(g);  // offload's device slices
  }
  for (const Param* p : host) m.host += seen.add(p->tensor) + seen.add(p->tensor.grad());
  for (const auto* moments : {&opt.exp_avg(), &opt.exp_avg_sq()}) {
    for (const auto& t : *moments) (offloaded ? m.host : m.optimizer) += seen.add(t);
  }
  // DDP's buckets: nothing beyond the gradients when these are views of them (parallel/data/ddp.h).
  if (ddp) {
    for (const auto& f : ddp->flats()) m.buffers += seen.add(f);
  }
  return m;
}

std::string memory_table(int64_t psi, int n, const MemoryUse& measured, const std::string& mode) {
  const double P = static_cast<double>(psi), N = n;
  auto h = [](double b) { return plan::human_bytes(b); };
  std::string out = fmt::format("training state per rank, P = {} parameters, N = {} data-parallel ranks (ZeRO paper, K = 12):\n",
                                psi, n);
  out += fmt::format("  {:<26} {:>14} {:>14}\n", "", "mixed precision", "fp32");
  out += fmt::format("  {:<26} {:>14} {:>14}\n", "DDP: 16P | 16P", h(16 * P), h(16 * P));
  out += fmt::format("  {:<26} {:>14} {:>14}\n", "ZeRO-1: 4P+12P/N | 8P+8P/N", h(4 * P + 12 * P / N), h(8 * P + 8 * P / N));
  out += fmt::format("  {:<26} {:>14} {:>14}\n", "ZeRO-2: 2P+14P/N | 4P+12P/N", h(2 * P + 14 * P / N), h(4 * P + 12 * P / N));
  out += fmt::format("  {:<26} {:>14} {:>14}\n", "ZeRO-3: 16P/N | 16P/N", h(16 * P / N), h(16 * P / N));
  out += fmt::format("  measured ({}): parameters {} + gradients {} + optimizer {} = {}; communication buffers {}\n",
                     mode, h(static_cast<double>(measured.params)), h(static_cast<double>(measured.grads)),
                     h(static_cast<double>(measured.optimizer)), h(static_cast<double>(measured.state())),
                     h(static_cast<double>(measured.buffers)));
  if (measured.host > 0) {
    out += fmt::format("  offloaded to host memory: master slices, their gradients and Adam's moments {}\n",
                       h(static_cast<double>(measured.host)));
  }
  return out;
}

namespace {

std::atomic<double> g_peak_floor{0};  // the high-water mark before PeakProbe's last reset

}  // namespace

double proc_status_bytes(const char* key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  const std::string want = std::string(key) + ":";
  while (std::getline(f, line)) {
    if (line.rfind(want, 0) == 0) return std::stod(line.substr(want.size())) * 1024.0;
  }
  throw std::runtime_error(fmt::format("/proc/self/status has no {} line", key));
}

double peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return std::max(static_cast<double>(u.ru_maxrss) * 1024.0, g_peak_floor.load());
}

PeakProbe::PeakProbe() {
  g_peak_floor = peak_rss_bytes();
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
  f.close();
  if (!f) throw std::runtime_error("cannot reset the resident-memory high-water mark (/proc/self/clear_refs)");
  start_ = proc_status_bytes("VmRSS");
}

double PeakProbe::extra_bytes() const { return std::max(0.0, proc_status_bytes("VmHWM") - start_); }

}  // namespace meshtrain
