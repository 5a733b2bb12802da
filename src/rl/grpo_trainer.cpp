#include "meshtrain/rl/grpo_trainer.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <random>
#include <unistd.h>

#include "meshtrain/ckpt/checkpoint.h"
#include "meshtrain/comm/comm.h"
#include "meshtrain/data/tasks.h"
#include "meshtrain/rl/evaluate.h"
#include "meshtrain/rl/grpo_objective.h"
#include "meshtrain/rl/rollout.h"
#include "meshtrain/runtime/mesh.h"
#include "meshtrain/runtime/runtime.h"
#include "meshtrain/train/config.h"
#include "meshtrain/train/engine.h"
#include "meshtrain/train/memory.h"
#include "meshtrain/train/state.h"
#include "meshtrain/train/trainer.h"

namespace meshtrain {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// SplitMix64: a completion's seed from (run seed, step, prompt, completion).
uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// The prompt at global position `pos` of the run: a seeded permutation per pass over the prompts.
size_t prompt_at(uint64_t pos, size_t n, uint64_t seed, std::map<uint64_t, std::vector<size_t>>& perms) {
  const uint64_t epoch = pos / n;
  auto& p = perms[epoch];
  if (p.empty()) {
    p.resize(n);
    std::iota(p.begin(), p.end(), 0);
    std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ULL + epoch);
    for (size_t i = n - 1; i > 0; --i) std::swap(p[i], p[rng() % (i + 1)]);
  }
  return p[pos % n];
}

struct Completion {
  std::vector<int64_t> prompt, generated;
  std::vector<float> logp;
  double reward = 0;
  bool exact = false;
};

}  // namespace

int train_grpo(const TrainConfig& c, Runtime& rt, const RewardFn* reward) {
  const RewardFn task_fn = task_reward_fn();
  const RewardFn& score = reward ? *reward : task_fn;
  auto layout = MeshLayout::create(rt.world_size(), {{"tp", c.tp}, {"cp", 1}, {"pp", 1}});
  DeviceMesh mesh(rt, layout);
  Comm& dp = mesh.group({"dp", "cp"});
  const bool lead = rt.rank() == 0;
  const int64_t P = c.global_batch, G = c.grpo.group;
  if (P % dp.size() != 0) {
    throw std::invalid_argument(fmt::format("train.global_batch {} prompts do not divide over {} data-parallel ranks", P,
                                            dp.size()));
  }
  if (!c.ckpt_dir.empty() && c.resume != "none" && ckpt::latest(c.ckpt_dir)) {
    throw std::invalid_argument(fmt::format("{} holds checkpoints and GRPO runs do not resume yet: use a new "
                                            "checkpoint.dir or checkpoint.resume = \"none\"",
                                            c.ckpt_dir));
  }
  const auto prompts = read_task_examples(c.grpo.prompts);
  std::vector<TaskExample> eval;
  if (!c.grpo.eval.empty()) {
    eval = read_task_examples(c.grpo.eval);
    if (static_cast<int64_t>(eval.size()) > c.grpo.eval_examples) eval.resize(c.grpo.eval_examples);
  }
  TrainEngine engine(c, rt, mesh, 1, lead);
  if (!c.init_from.empty()) {
    ckpt::Reader r(ckpt::resolve(c.init_from));
    engine.load_weights(r);
    if (lead) fmt::print("weights from {} (step {})\n", r.dir(), r.manifest().value("step", 0));
  }
  auto& objective = dynamic_cast<GrpoObjective&>(engine.objective());
  Transformer& model = engine.model();
  const int64_t mine = P / dp.size(), first = dp.rank() * mine;
  if (lead) {
    fmt::print("GRPO on {} ({} prompts): {} prompts per step x {} completions, {} per data-parallel rank; loss {}, "
               "epsilon {}/{}, beta {}, {} epoch(s) per rollout\n",
               c.grpo.task, prompts.size(), P, G, mine * G, c.grpo.loss, c.grpo.epsilon, c.grpo.epsilon_high,
               c.grpo.beta, c.grpo.epochs);
  }
  std::unique_ptr<ckpt::Checkpointer> saver;
  if (!c.ckpt_dir.empty()) {
    saver = std::make_unique<ckpt::Checkpointer>(ckpt::SaveOptions{c.ckpt_dir, c.ckpt_keep, false, 600}, mesh.world());
  }
  std::ofstream metrics;
  if (lead && !c.metrics.empty()) {
    std::filesystem::path p(c.metrics);
    if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
    metrics.open(c.metrics, std::ios::app);
  }
  // Every replica evaluates (a tp group generates together); rank 0 reports.
  auto evaluate = [&](int64_t s, nlohmann::json& j) {
    if (eval.empty()) return;
    // Greedy, and sampled at the rollout temperature (what GRPO optimises).
    const TaskScore e = evaluate_task(model, eval, c.grpo.max_new);
    const TaskScore sampled = evaluate_task(model, eval, c.grpo.max_new, 64, c.grpo.temperature, c.seed);
    if (lead) {
      fmt::print("step {:>5} | held-out accuracy {:.3f} greedy ({}/{}), {:.3f} sampled at temperature {} | mean "
                 "reward {:.3f}\n",
                 s, e.accuracy(), e.exact, e.examples, sampled.accuracy(), c.grpo.temperature, e.reward);
      j["eval_accuracy"] = e.accuracy();
      j["eval_sampled_accuracy"] = sampled.accuracy();
      j["eval_reward"] = e.reward;
    }
  };
  {
    nlohmann::json j{{"step", 0}};
    evaluate(0, j);
    if (lead && metrics.is_open()) metrics << j.dump() << "\n" << std::flush;
  }
  std::map<uint64_t, std::vector<size_t>> perms;
  for (int64_t s = 1; s <= c.steps; ++s) {
    // Rollouts: this rank's prompts, G completions each, batched by prompt length.
    const auto t0 = Clock::now();
    std::vector<Completion> done(static_cast<size_t>(mine * G));
    std::map<size_t, std::vector<int64_t>> by_length;  // prompt length -> local prompt indices
    std::vector<size_t> which(static_cast<size_t>(mine));
    for (int64_t k = 0; k < mine; ++k) {
      which[k] = prompt_at(static_cast<uint64_t>((s - 1) * P + first + k), prompts.size(), c.seed, perms);
      by_length[CharVocab::encode(prompts[which[k]].prompt).size()].push_back(k);
    }
    RolloutOptions ro;
    ro.sample.max_new_tokens = c.grpo.max_new;
    ro.sample.temperature = c.grpo.temperature;
    ro.sample.stop_token = CharVocab::end();
    ro.sample.vocab_limit = CharVocab::size();
    ro.pad = CharVocab::end();
    for (const auto& [length, ks] : by_length) {
      std::vector<int64_t> flat;
      std::vector<uint64_t> seeds;
      for (int64_t k : ks) {
        const auto ids = CharVocab::encode(prompts[which[k]].prompt);
        for (int64_t g = 0; g < G; ++g) {
          flat.insert(flat.end(), ids.begin(), ids.end());
          seeds.push_back(mix(mix(mix(c.seed) + static_cast<uint64_t>(s)) + static_cast<uint64_t>((first + k) * G + g)));
        }
      }
      const int64_t rows = static_cast<int64_t>(seeds.size());
      const Rollout r = rollout(model, at::tensor(flat, at::kLong).view({rows, static_cast<int64_t>(length)}), ro, seeds);
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t k = ks[i / G], g = i % G, len = r.lengths[i].item<int64_t>();
        Completion& cpl = done[k * G + g];
        cpl.prompt.assign(flat.begin() + i * static_cast<int64_t>(length), flat.begin() + (i + 1) * static_cast<int64_t>(length));
        const at::Tensor gen = r.tokens[i].narrow(0, r.prompt, len).contiguous();
        cpl.generated.assign(gen.data_ptr<int64_t>(), gen.data_ptr<int64_t>() + len);
        const at::Tensor lp = r.logprobs[i].narrow(0, 0, len).contiguous();
        cpl.logp.assign(lp.data_ptr<float>(), lp.data_ptr<float>() + len);
        cpl.exact = task_reward(cpl.generated, prompts[which[k]]).exact > 0;
        if (c.grpo.reward_command.empty()) cpl.reward = score(prompts[which[k]], cpl.generated);
      }
    }
    if (!c.grpo.reward_command.empty()) {
      // One call of the user's command for this rank's completions.
      std::vector<TaskExample> examples;
      std::vector<std::vector<int64_t>> completions;
      for (int64_t i = 0; i < mine * G; ++i) {
        examples.push_back(prompts[which[i / G]]);
        completions.push_back(done[i].generated);
      }
      const auto scratch = std::filesystem::temp_directory_path() /
                           fmt::format("meshtrain_reward_{}_{}", getpid(), rt.rank());
      const std::vector<double> scores = command_rewards(c.grpo.reward_command, examples, completions, scratch.string());
      for (int64_t i = 0; i < mine * G; ++i) done[i].reward = scores[i];
    }
    const double rollout_s = seconds_since(t0);
    // The rollout batch: rows prompt + completion, right-padded to a common length.
    size_t S = 0;
    for (const auto& cpl : done) S = std::max(S, cpl.prompt.size() + cpl.generated.size());
    const int64_t R = static_cast<int64_t>(done.size());
    RolloutBatch b;
    b.tokens = at::full({R, static_cast<int64_t>(S)}, CharVocab::end(), at::kLong);
    b.old_logp = at::zeros({R, static_cast<int64_t>(S) - 1}, at::kFloat);
    b.mask = at::zeros({R, static_cast<int64_t>(S) - 1}, at::kFloat);
    std::vector<double> rewards;
    double exact = 0, length = 0;
    for (int64_t i = 0; i < R; ++i) {
      const Completion& cpl = done[i];
      const int64_t p = static_cast<int64_t>(cpl.prompt.size()), n = static_cast<int64_t>(cpl.generated.size());
      std::vector<int64_t> row = cpl.prompt;
      row.insert(row.end(), cpl.generated.begin(), cpl.generated.end());
      b.tokens[i].narrow(0, 0, p + n).copy_(at::tensor(row, at::kLong));
      if (n > 0) {
        // Token p + t is predicted at position p + t - 1.
        b.old_logp[i].narrow(0, p - 1, n).copy_(at::tensor(cpl.logp, at::kFloat));
        b.mask[i].narrow(0, p - 1, n).fill_(1);
      }
      rewards.push_back(cpl.reward);
      exact += cpl.exact;
      length += static_cast<double>(n);
    }
    b.advantages = group_advantages(at::tensor(rewards, at::kDouble), G).to(at::kFloat);
    objective.set_rollouts(b);
    // Optimisation: grpo.epochs steps over the rollout batch.
    const auto t1 = Clock::now();
    StepResult r;
    for (int64_t e = 0; e < c.grpo.epochs; ++e) {
      std::vector<Batch> micro;
      for (int64_t i = 0; i < R; i += c.micro_batch) {
        std::vector<uint64_t> ids;
        for (int64_t k = i; k < std::min(R, i + c.micro_batch); ++k) ids.push_back(static_cast<uint64_t>(k));
        micro.push_back(objective.rows(ids));
      }
      r = engine.step(micro);
    }
    const double train_s = seconds_since(t1);
    // Reward statistics over the global batch.
    const at::Tensor rw = at::tensor(rewards, at::kDouble);
    at::Tensor sums = at::tensor(std::vector<double>{rw.sum().item<double>(), (rw * rw).sum().item<double>(), exact,
                                                     length, static_cast<double>(R)},
                                 at::kDouble);
    dp.all_reduce(sums);
    const double n = sums[4].item<double>(), mean = sums[0].item<double>() / n;
    const double sd = std::sqrt(std::max(0.0, sums[1].item<double>() / n - mean * mean));
    nlohmann::json j{{"step", s},
                     {"loss", r.loss},
                     {"reward", mean},
                     {"reward_std", sd},
                     {"accuracy", sums[2].item<double>() / n},
                     {"completion_length", sums[3].item<double>() / n},
                     {"grad_norm", r.grad_norm},
                     {"lr", r.lr},
                     {"rollout_s", rollout_s},
                     {"train_s", train_s},
                     {"peak_mem_bytes", peak_rss_bytes()}};
    for (const auto& [name, value] : r.metrics) j[name] = value;
    if (lead && (s % c.log_every == 0 || s == 1 || s == c.steps)) {
      fmt::print("step {:>5} | reward {:.3f} +- {:.3f} | accuracy {:.3f} | length {:.1f} | loss {:.4f} | kl {:.4f} | "
                 "clip {:.3f}/{:.3f} | entropy {:.3f} | rollout {:.2f} s | train {:.2f} s\n",
                 s, mean, sd, j["accuracy"].get<double>(), j["completion_length"].get<double>(), r.loss,
                 j.value("kl", 0.0), j.value("clip_low", 0.0), j.value("clip_high", 0.0), j.value("entropy", 0.0),
                 rollout_s, train_s);
    }
    if (s % c.eval_every == 0 || s == c.steps) evaluate(s, j);
    if (lead && metrics.is_open()) metrics << j.dump() << "\n" << std::flush;
    if (saver && ((c.ckpt_every > 0 && s % c.ckpt_every == 0) || s == c.steps)) {
      const nlohmann::json fields{
          {"config", {{"model", spec_to_json(c.model)}, {"train", {{"seed", c.seed}, {"method", "grpo"}}}}},
          {"mesh", {{"tp", c.tp}, {"pp", 1}, {"dp", dp.size()}, {"cp", 1}}},
          {"optimizer", {{"steps", engine.optimizer().steps()}}},
          {"lora", c.lora.rank > 0 ? nlohmann::json{{"rank", c.lora.rank}, {"alpha", c.lora.alpha},
                                                    {"dropout", c.lora.dropout}, {"targets", c.lora.targets}}
                                   : nlohmann::json(nullptr)},
          {"base", adapter_checkpoints(c) ? nlohmann::json{{"from", c.init_from}} : nlohmann::json(nullptr)}};
      saver->save(s, engine.pieces(dp.rank(), rt.rank(), adapter_checkpoints(c)), fields, nlohmann::json::object());
      if (lead) fmt::print("step {:>5} | checkpoint {}/{}\n", s, c.ckpt_dir, ckpt::step_dir_name(s));
    }
  }
  if (saver) {
    saver->wait();
    mesh.world().barrier();
  }
  return 0;
}

}  // namespace meshtrain
