// One training step replayed from a checkpoint and diagnosed (train/diagnose.h).
#include "meshtrain/train/diagnose.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <unordered_set>

#include "meshtrain/ckpt/checkpoint.h"
#include "meshtrain/data/loader.h"
#include "meshtrain/model/transformer.h"
#include "meshtrain/platform/fault.h"
#include "meshtrain/runtime/mesh.h"
#include "meshtrain/runtime/runtime.h"
#include "meshtrain/train/config.h"
#include "meshtrain/train/engine.h"
#include "meshtrain/train/run_checkpoints.h"
#include "meshtrain/train/trainer.h"
#include "train/spike_defence.h"

namespace meshtrain {
namespace {

// A sum of squares over the micro-batches, and whether all of it was finite.
struct SquareSum {
  double sum = 0;
  int64_t n = 0;
  bool finite = true;
  bool add(const at::Tensor& t) {
    const double s = t.to(at::kDouble).pow(2).sum().item<double>();
    finite = finite && std::isfinite(s);
    sum += s;
    n += t.numel();
    return std::isfinite(s);
  }
  double rms() const { return n == 0 ? 0 : std::sqrt(sum / static_cast<double>(n)); }
};

// Each block's output (forward) and its gradient (backward), through the
// model's unit hooks; the first non-finite one of each pass.
class LayerProbe : public UnitHooks {
 public:
  void before_unit(int64_t) override {}
  at::Tensor after_unit(int64_t unit, const at::Tensor& out) override {
    const int64_t layer = unit - 1;
    if (layer < 0 || layer >= layers) return out;  // the embedding's or the head's output
    if (layer == 0) ++micro_seen;
    if (!fwd[layer].add(out.detach()) && first_fwd.empty()) {
      first_fwd = fmt::format("layers.{} output (forward, micro-batch {})", layer, micro_seen - 1);
    }
    if (out.requires_grad()) {
      const int64_t m = micro_seen - 1;
      out.register_hook([this, layer, m](const at::Tensor& g) {
        if (!bwd[layer].add(g.detach()) && first_bwd.empty()) {
          first_bwd = fmt::format("gradient of layers.{} output (backward, micro-batch {})", layer, m);
        }
      });
    }
    return out;
  }
  explicit LayerProbe(int64_t l) : layers(l) {}
  const int64_t layers;
  std::map<int64_t, SquareSum> fwd, bwd;
  std::string first_fwd, first_bwd;
  int64_t micro_seen = 0;
};

// The layer a parameter belongs to: "layers.3" or its first name part.
std::string layer_of(const std::string& name) {
  const size_t dot = name.find('.');
  if (name.rfind("layers.", 0) == 0) return name.substr(0, name.find('.', dot + 1));
  return name.substr(0, dot);
}

struct Replay {
  double loss = 0, grad_norm = 0, lr = 0;
  std::vector<std::pair<std::string, at::Tensor>> after;  // every parameter after the update
  std::vector<Batch> batch;                                // the step's micro-batches
  std::vector<LayerDiagnosis> layers;
  std::string first_nonfinite, exploding;
  int64_t from_step = 0;
};

// The config the checkpoint was trained with, on a mesh of one process.
TrainConfig replay_config(const ckpt::Reader& r) {
  if (!r.manifest().contains("config_toml")) {
    throw std::invalid_argument(fmt::format("{}: its manifest holds no config_toml (written by meshtrain since the "
                                            "step diagnosis came): save a checkpoint with this meshtrain first",
                                            r.dir()));
  }
  const auto tmp = std::filesystem::temp_directory_path() / fmt::format("meshtrain-diagnose-{}.toml", getpid());
  std::ofstream(tmp) << without_unread_sections(r.manifest()["config_toml"].get<std::string>());
  const std::vector<std::string> one_process = {
      "parallel.tp=1",    "parallel.sp=false",     "parallel.cp=1",         "parallel.pp=1",  "parallel.ep=1",
      "parallel.virtual=1", "parallel.nproc=1",    "parallel.zero=0",       "parallel.dp_shard=0", "parallel.pp_layers=[]",
      "train.metrics=\"\"", "checkpoint.dir=\"\"", "spike.policy=\"off\"", "check.replicas_every=0"};
  try {
    TrainConfig c = load_train_config(tmp.string(), one_process);
    std::filesystem::remove(tmp);
    return c;
  } catch (...) {
    std::filesystem::remove(tmp);
    throw;
  }
}

Replay replay(const TrainConfig& c, const std::string& path, int64_t step, Runtime& rt, DeviceMesh& mesh) {
  const int64_t accumulation = c.global_batch / c.micro_batch;
  TrainEngine engine(c, rt, mesh, accumulation, false);
  ckpt::Reader r(path, c.ckpt_staging_mb << 20);
  const auto& m = r.manifest();
  if (!c.init_from.empty()) {  // the pinned starting weights: adapters' base first, as the trainer does
    ckpt::Reader base(starting_weights(c, path).step_dir);
    if (adapter_checkpoints(c)) engine.load_weights(base);
    engine.load_reference(base);
  }
  if (c.lora_quantize != "none") engine.quantize_base();
  engine.load(r);
  Replay out;
  out.from_step = m.at("step").get<int64_t>();
  LoaderOptions lo = loader_options(c);
  lo.documents = true;  // for the statistics; the model gets them only with train.document_mask
  TokenLoader loader = train_loader(c, 0, 1, lo);
  loader.restore({m.at("loader").at("epoch").get<uint64_t>(),
                  m.at("loader").at("windows").get<uint64_t>() / static_cast<uint64_t>(c.micro_batch)});
  SpikeDefence dropped(c.spike, accumulation, static_cast<uint64_t>(c.micro_batch));
  dropped.restore(m.value("spike", nlohmann::json()), false);
  LayerProbe probe(c.model.layers);
  std::vector<Param> params = engine.model_params();
  std::vector<at::Tensor> before;
  for (int64_t s = out.from_step + 1; s <= step; ++s) {
    dropped.begin_step(s, loader);
    set_fault_step(s);
    std::vector<Batch> micro;
    for (int64_t i = 0; i < accumulation; ++i) {
      micro.push_back(loader.next());
      if (s == step) out.batch.push_back(micro.back());
      if (!c.document_mask) micro.back().doc_ids = at::Tensor();
    }
    if (s == step) {
      engine.model().set_unit_hooks(&probe);
      for (const auto& p : params) before.push_back(p.tensor.detach().clone());
    }
    const StepResult res = engine.step(s, micro);
    out.loss = res.loss;
    out.grad_norm = res.grad_norm;
    out.lr = res.lr;
  }
  engine.model().set_unit_hooks(nullptr);
  set_fault_step(0);
  // Per layer: parameters' norms, then the block outputs' RMS.
  std::map<std::string, std::array<double, 3>> sums;  // grad^2, weight^2, update^2
  std::vector<std::string> order;
  std::string first_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    const Param& p = params[i];
    const std::string layer = layer_of(p.name);
    if (!sums.count(layer)) order.push_back(layer);
    auto& s = sums[layer];
    const at::Tensor w = p.tensor.detach().to(at::kDouble);
    if (p.tensor.grad().defined()) {
      const double g = p.tensor.grad().to(at::kDouble).pow(2).sum().item<double>();
      if (!std::isfinite(g) && first_grad.empty()) first_grad = "gradient of " + p.name;
      s[0] += g;
    }
    s[1] += before[i].to(at::kDouble).pow(2).sum().item<double>();  // the weights the step started from
    s[2] += (w - before[i].to(at::kDouble)).pow(2).sum().item<double>();
    out.after.emplace_back(p.name, p.tensor.detach().clone());
  }
  double previous = 0;
  for (const auto& name : order) {
    LayerDiagnosis l{name, 0, 0, std::sqrt(sums[name][0]), std::sqrt(sums[name][1]), std::sqrt(sums[name][2])};
    if (name.rfind("layers.", 0) == 0) {
      const int64_t i = std::stoll(name.substr(7));
      l.act_rms = probe.fwd[i].rms();
      l.act_grad_rms = probe.bwd[i].rms();
      if (out.exploding.empty() && previous > 0 && std::isfinite(l.act_rms) && l.act_rms > 100 * previous) {
        out.exploding = fmt::format("{} output RMS {:.4g} is {:.0f}x the layer before's", name, l.act_rms,
                                    l.act_rms / previous);
      }
      previous = l.act_rms;
    }
    out.layers.push_back(l);
  }
  out.first_nonfinite = !probe.first_fwd.empty() ? probe.first_fwd
                        : !std::isfinite(out.loss) ? "the loss (every layer output finite: the head or the loss)"
                        : !probe.first_bwd.empty() ? probe.first_bwd
                                                    : first_grad;
  return out;
}

// The data layer's statistics of the step's batch.
void batch_stats(const std::vector<Batch>& batch, StepDiagnosis& d) {
  std::map<int64_t, int64_t> counts;
  std::set<std::vector<int64_t>> rows;
  std::unordered_set<uint64_t> grams;
  int64_t total = 0, repeated_rows = 0, gram_count = 0, repeated_grams = 0;
  std::vector<int64_t> pieces;
  for (const Batch& b : batch) {
    const at::Tensor t = b.tokens.contiguous();
    const int64_t n = t.size(0), s = t.size(1);
    d.seq = s;
    for (int64_t r = 0; r < n; ++r) {
      const int64_t* row = t.data_ptr<int64_t>() + r * s;
      std::vector<int64_t> v(row, row + s);
      for (int64_t x : v) ++counts[x];
      total += s;
      if (!rows.insert(v).second) ++repeated_rows;
      for (int64_t i = 0; i + 8 <= s; ++i, ++gram_count) {
        if (!grams.insert(XXH64(row + i, 8 * sizeof(int64_t), 0)).second) ++repeated_grams;
      }
      if (b.doc_ids.defined()) {
        const int64_t* doc = b.doc_ids.contiguous().data_ptr<int64_t>() + r * s;
        int64_t len = 1;
        for (int64_t i = 1; i <= s; ++i, ++len) {
          if (i == s || doc[i] != doc[i - 1]) {
            pieces.push_back(len);
            len = 0;
          }
        }
      }
    }
    d.windows += n;
  }
  d.distinct_tokens = static_cast<int64_t>(counts.size());
  std::vector<std::pair<int64_t, int64_t>> by_count(counts.begin(), counts.end());
  std::sort(by_count.begin(), by_count.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second > b.second : a.first < b.first;
  });
  for (size_t i = 0; i < std::min<size_t>(5, by_count.size()); ++i) {
    d.top_tokens.emplace_back(by_count[i].first, static_cast<double>(by_count[i].second) / static_cast<double>(total));
  }
  d.repeated_windows = d.windows ? static_cast<double>(repeated_rows) / static_cast<double>(d.windows) : 0;
  d.repeated_8grams = gram_count ? static_cast<double>(repeated_grams) / static_cast<double>(gram_count) : 0;
  d.doc_pieces = static_cast<int64_t>(pieces.size());
  if (!pieces.empty()) {
    d.doc_min = *std::min_element(pieces.begin(), pieces.end());
    d.doc_max = *std::max_element(pieces.begin(), pieces.end());
    int64_t sum = 0;
    for (int64_t p : pieces) sum += p;
    d.doc_mean = static_cast<double>(sum) / static_cast<double>(pieces.size());
  }
}

// Bitwise: NaN equals NaN when the bits do.
bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

}  // namespace

StepDiagnosis diagnose_step(const std::string& checkpoint, int64_t step, Runtime& rt) {
  if (rt.world_size() != 1) {
    throw std::invalid_argument("meshtrain diagnose step replays on one process; run it without a launcher");
  }
  const std::string path = ckpt::resolve(checkpoint);
  const TrainConfig c = replay_config(ckpt::Reader(path));
  const int64_t from = ckpt::Reader(path).manifest().at("step").get<int64_t>();
  if (step <= from) {
    throw std::invalid_argument(fmt::format("--step {}: the checkpoint {} holds the state after step {}; the step to "
                                            "replay must come after it (--step {} or later, or an older checkpoint)",
                                            step, path, from, from + 1));
  }
  DeviceMesh mesh(rt, MeshLayout::create(1, {{"tp", 1}, {"cp", 1}, {"pp", 1}}));
  const Replay a = replay(c, path, step, rt, mesh);
  const Replay b = replay(c, path, step, rt, mesh);
  StepDiagnosis d;
  d.checkpoint = path;
  d.from_step = a.from_step;
  d.step = step;
  d.loss = a.loss;
  d.grad_norm = a.grad_norm;
  d.lr = a.lr;
  batch_stats(a.batch, d);
  d.layers = a.layers;
  d.first_nonfinite = a.first_nonfinite;
  d.exploding = a.exploding;
  if (!same_bits(a.loss, b.loss)) {
    d.first_difference = fmt::format("the loss ({:.17g} then {:.17g})", a.loss, b.loss);
  } else if (!same_bits(a.grad_norm, b.grad_norm)) {
    d.first_difference = fmt::format("the gradient norm ({:.17g} then {:.17g})", a.grad_norm, b.grad_norm);
  } else {
    for (size_t i = 0; i < a.after.size() && d.first_difference.empty(); ++i) {
      const at::Tensor& x = a.after[i].second;
      const at::Tensor& y = b.after[i].second;
      if (x.nbytes() != y.nbytes() || std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) != 0) {
        d.first_difference = a.after[i].first + " after the update";
      }
    }
  }
  d.bitwise_equal = d.first_difference.empty();
  return d;
}

std::string diagnosis_text(const StepDiagnosis& d) {
  std::string out = fmt::format(
      "step {} replayed on one process from {} (the state after step {}{})\n"
      "loss {:.6g} | grad norm {:.6g} | lr {:.3e}\n\n",
      d.step, d.checkpoint, d.from_step,
      d.step == d.from_step + 2   ? fmt::format("; step {} replayed first", d.from_step + 1)
      : d.step > d.from_step + 2 ? fmt::format("; steps {}..{} replayed first", d.from_step + 1, d.step - 1)
                                 : "",
      d.loss,
      d.grad_norm, d.lr);
  std::string top;
  for (const auto& [tok, f] : d.top_tokens) top += fmt::format("{}{} ({:.1f}%)", top.empty() ? "" : ", ", tok, 100 * f);
  out += fmt::format("data: {} windows of {} tokens; {} distinct tokens, the most frequent {}; windows repeated within "
                     "the batch {:.1f}%, 8-grams repeated {:.1f}%; {} document pieces, {:.1f} tokens on average "
                     "({}..{})\n\n",
                     d.windows, d.seq, d.distinct_tokens, top, 100 * d.repeated_windows, 100 * d.repeated_8grams,
                     d.doc_pieces, d.doc_mean, d.doc_min, d.doc_max);
  out += fmt::format("numerics, per layer (forward order; output RMS and its gradient's for blocks):\n"
                     "{:<12} {:>12} {:>14} {:>12} {:>12} {:>12} {:>14}\n",
                     "layer", "output RMS", "output grad", "grad norm", "weight norm", "update norm", "update/weight");
  for (const auto& l : d.layers) {
    const bool block = l.name.rfind("layers.", 0) == 0;
    out += fmt::format("{:<12} {:>12} {:>14} {:>12.4g} {:>12.4g} {:>12.4g} {:>14.3g}\n", l.name,
                       block ? fmt::format("{:.4g}", l.act_rms) : "-", block ? fmt::format("{:.4g}", l.act_grad_rms) : "-",
                       l.grad, l.weight, l.update, l.update / l.weight);
  }
  out += "\n";
  out += d.first_nonfinite.empty() ? "first non-finite tensor: none (every output, gradient and the loss is finite)\n"
                                   : fmt::format("first non-finite tensor: {}\n", d.first_nonfinite);
  out += d.exploding.empty() ? "exploding: no layer's output grows more than 100x over the layer before\n"
                             : fmt::format("exploding: {}\n", d.exploding);
  out += d.bitwise_equal ? "determinism: replayed twice, bitwise equal (loss, gradient norm, every parameter after the "
                           "update)\n"
                         : fmt::format("determinism: replayed twice, they differ first in {}\n", d.first_difference);
  return out;
}

}  // namespace meshtrain
