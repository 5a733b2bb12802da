#include "meshtrain/parallel/data/ddp.h"

#include <ATen/Functions.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>

#include <stdexcept>

#include "meshtrain/comm/comm.h"
#include "meshtrain/platform/device.h"
#include "parallel/data/grad_ready.h"

namespace meshtrain {
namespace {

// Buckets and flats live on the device the parameters do (platform/device.h).
at::TensorOptions on_device(at::ScalarType t) { return at::TensorOptions(compute_device()).dtype(t); }

struct Bucket {
  std::vector<size_t> params;   // indices into the parameter list
  std::vector<int64_t> offsets; // of each in `flat`
  at::Tensor flat;              // fp32
  size_t pending = 0;           // parameters not ready yet
  bool launched = false;
  CommWork work;
};

}  // namespace

struct DataParallel::State {
  std::vector<Param>& params;
  Comm& dp;
  DdpOptions o;
  std::vector<Bucket> buckets;
  std::vector<size_t> bucket_of, slot_of;
  std::vector<bool> ready;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;  // the tensors hold them weakly: keep them alive
  bool sync = true, saw_backward = false;
  size_t next_launch = 0;

  State(std::vector<Param>& p, Comm& d, DdpOptions opt) : params(p), dp(d), o(opt) {}

  void reset() {
    for (auto& b : buckets) {
      b.pending = b.params.size();
      b.launched = false;
    }
    ready.assign(params.size(), false);
    next_launch = 0;
    saw_backward = false;
  }

  void launch(Bucket& b) {
    b.work = dp.all_reduce_async(b.flat);
    b.launched = true;
  }

  // Launches, in index order, every bucket whose predecessors are launched.
  void launch_ready() {
    while (next_launch < buckets.size() && buckets[next_launch].pending == 0) launch(buckets[next_launch++]);
  }

  // Parameter i's slot in its bucket, shaped as the parameter.
  at::Tensor slot(size_t i) {
    const Bucket& b = buckets[bucket_of[i]];
    const at::Tensor& t = params[i].tensor;
    return b.flat.narrow(0, b.offsets[slot_of[i]], t.numel()).view(t.sizes());
  }

  void mark_ready(size_t i) {
    if (!sync) return;
    saw_backward = true;
    if (ready[i]) return;  // a second accumulation in the same backward: already counted
    ready[i] = true;
    const at::Tensor s = slot(i);
    const at::Tensor& g = params[i].tensor.grad();
    if (g.data_ptr() != s.data_ptr()) s.copy_(g);  // a gradient zero_grad() did not place in its slot
    buckets[bucket_of[i]].pending -= 1;
    if (o.overlap) launch_ready();
  }
};

DataParallel::DataParallel(std::vector<Param>& params, Comm& dp, DdpOptions o)
    : s_(std::make_unique<State>(params, dp, o)) {
  if (o.bucket_bytes < 1) throw std::invalid_argument(fmt::format("ddp bucket size {} must be positive", o.bucket_bytes));
  const size_t n = params.size();
  s_->bucket_of.assign(n, 0);
  s_->slot_of.assign(n, 0);
  // Reverse registration order: backward produces the last layers' gradients first.
  int64_t bytes = 0;
  for (size_t k = n; k-- > 0;) {
    const Param& p = params[k];
    if (p.tensor.scalar_type() != at::kFloat) {
      throw std::invalid_argument(fmt::format("ddp: parameter {} is {}, expected fp32 (master weights)", p.name,
                                              c10::toString(p.tensor.scalar_type())));
    }
    const int64_t b = p.tensor.numel() * 4;
    if (s_->buckets.empty() || (bytes > 0 && bytes + b > o.bucket_bytes)) {
      s_->buckets.emplace_back();
      bytes = 0;
    }
    Bucket& bucket = s_->buckets.back();
    s_->bucket_of[k] = s_->buckets.size() - 1;
    s_->slot_of[k] = bucket.params.size();
    bucket.offsets.push_back(bytes / 4);
    bucket.params.push_back(k);
    bytes += b;
  }
  for (auto& b : s_->buckets) {
    int64_t numel = 0;
    for (size_t k : b.params) numel += params[k].tensor.numel();
    b.flat = at::zeros({numel}, on_device(at::kFloat));
  }
  s_->reset();
  // Every replica starts from rank 0's weights.
  at::NoGradGuard no_grad;
  for (auto& b : s_->buckets) {
    for (size_t j = 0; j < b.params.size(); ++j) {
      const at::Tensor& t = params[b.params[j]].tensor;
      b.flat.narrow(0, b.offsets[j], t.numel()).copy_(t.detach().reshape({-1}));
    }
    dp.broadcast(b.flat, 0);
    for (size_t j = 0; j < b.params.size(); ++j) {
      at::Tensor t = params[b.params[j]].tensor.detach();
      t.copy_(b.flat.narrow(0, b.offsets[j], t.numel()).view_as(t));
    }
  }
  for (size_t k = 0; k < n; ++k) {
    State* s = s_.get();
    s->accumulators.push_back(on_grad_ready(params[k].tensor, "ddp: parameter " + params[k].name, [s, k] { s->mark_ready(k); }));
  }
}

DataParallel::~DataParallel() = default;

void DataParallel::set_sync(bool sync) { s_->sync = sync; }

void DataParallel::finish() {
  State& s = *s_;
  if (!s.sync) throw std::logic_error("ddp: finish() after a backward without sync");
  // Parameters that got no gradient: an error, or zeros when allowed.
  std::vector<std::string> unused = sweep_unused(s.params, s.ready, s.o.find_unused, [&](size_t k) {
    s.slot(k).zero_();
    s.buckets[s.bucket_of[k]].pending -= 1;
  });
  if (!unused.empty()) {
    for (auto& b : s.buckets) {
      if (b.launched) b.work.wait();
    }
    s.reset();
    throw_unused("ddp", std::move(unused));
  }
  s.launch_ready();
  for (auto& b : s.buckets) {
    b.work.wait();
    for (size_t k : b.params) {
      at::Tensor& g = s.params[k].tensor.mutable_grad();
      const at::Tensor slot = s.slot(k);
      if (!g.defined()) {
        g = slot;
      } else if (g.data_ptr() != slot.data_ptr()) {
        g.copy_(slot);
      }
    }
  }
  s.reset();
}

void DataParallel::zero_grad() {
  for (auto& b : s_->buckets) b.flat.zero_();
  for (size_t k = 0; k < s_->params.size(); ++k) s_->params[k].tensor.mutable_grad() = s_->slot(k);
}

size_t DataParallel::buckets() const { return s_->buckets.size(); }

std::vector<at::Tensor> DataParallel::flats() const {
  std::vector<at::Tensor> out;
  for (const auto& b : s_->buckets) out.push_back(b.flat);
  return out;
}

std::vector<std::vector<std::string>> DataParallel::bucket_names() const {
  std::vector<std::vector<std::string>> out;
  for (const auto& b : s_->buckets) {
    out.emplace_back();
    for (size_t k : b.params) out.back().push_back(s_->params[k].name);
  }
  return out;
}

}  // namespace meshtrain
