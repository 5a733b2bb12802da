#include "meshtrain/rl/rl_trainer.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <unistd.h>

#include "meshtrain/ckpt/checkpoint.h"
#include "meshtrain/ckpt/pin.h"
#include "meshtrain/comm/comm.h"
#include "meshtrain/data/tasks.h"
#include "meshtrain/peft/lora.h"
#include "meshtrain/rl/evaluate.h"
#include "meshtrain/rl/critic.h"
#include "meshtrain/rl/environment.h"
#include "meshtrain/rl/episode.h"
#include "meshtrain/rl/grpo_objective.h"
#include "meshtrain/rl/ppo.h"
#include "meshtrain/rl/reward_model.h"
#include "meshtrain/rl/rollout.h"
#include "meshtrain/rl/settings.h"
#include "meshtrain/plan/posttrain.h"
#include "meshtrain/runtime/mesh.h"
#include "meshtrain/runtime/runtime.h"
#include "meshtrain/train/config.h"
#include "train/spike_defence.h"
#include "meshtrain/train/engine.h"
#include "meshtrain/train/memory.h"
#include "meshtrain/train/state.h"
#include "meshtrain/train/run_checkpoints.h"
#include "meshtrain/train/trainer.h"

namespace meshtrain {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

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

// This rank's episodes of step s: prompts `which` (indices into `prompts`,
// global positions first .. first + size - 1), `G` each, scored by `score` on
// their answers (or by one call of the user's command). Returns them with
// their rewards.
std::vector<Episode> collect(Transformer& model, const TrainConfig& c, int64_t s, int64_t first,
                             const std::vector<TaskExample>& prompts, const std::vector<size_t>& which,
                             const RewardFn& score, Environment* env, int rank, std::vector<double>& rewards) {
  const int64_t G = rl_settings(c).group, mine = static_cast<int64_t>(which.size());
  std::vector<std::vector<int64_t>> encoded;
  std::vector<const TaskExample*> examples;
  std::vector<uint64_t> seeds;
  for (int64_t k = 0; k < mine; ++k) {
    const auto ids = CharVocab::encode(prompts[which[k]].prompt);
    for (int64_t g = 0; g < G; ++g) {
      encoded.push_back(ids);
      examples.push_back(&prompts[which[k]]);
      seeds.push_back(splitmix64(splitmix64(splitmix64(c.seed) + static_cast<uint64_t>(s)) +
                                 static_cast<uint64_t>((first + k) * G + g)));
    }
  }
  EpisodeOptions o;
  o.rollout.sample.max_new_tokens = rl_settings(c).max_new;
  o.rollout.sample.temperature = rl_settings(c).temperature;
  o.rollout.sample.stop_token = CharVocab::end();
  o.rollout.sample.vocab_limit = CharVocab::size();
  o.rollout.pad = CharVocab::end();
  o.env = env;
  o.max_turns = env ? rl_settings(c).max_turns : 1;
  std::vector<Episode> eps = run_episodes(model, encoded, examples, seeds, o);
  rewards.assign(eps.size(), 0.0);
  if (rl_settings(c).reward_command.empty()) {
    for (size_t i = 0; i < eps.size(); ++i) rewards[i] = score(*examples[i], eps[i].answer);
  } else {
    // One call of the user's command for this rank's answers.
    std::vector<TaskExample> ex;
    std::vector<std::vector<int64_t>> answers;
    for (size_t i = 0; i < eps.size(); ++i) {
      ex.push_back(*examples[i]);
      answers.push_back(eps[i].answer);
    }
    rewards = command_rewards({rl_settings(c).reward_command, rl_settings(c).reward_shell, rl_settings(c).reward_timeout}, ex, answers);
  }
  return eps;
}

// Micro-batches of train.micro_batch rows of this rank's R, made by `rows`; the rank's rows are
// `first`.. of the step's global batch (the dropout masks' rows).
template <typename Rows>
std::vector<Batch> micro_batches(int64_t R, int64_t micro, int64_t first, const Rows& rows) {
  std::vector<Batch> out;
  for (int64_t i = 0; i < R; i += micro) {
    std::vector<uint64_t> ids;
    for (int64_t k = i; k < std::min(R, i + micro); ++k) ids.push_back(static_cast<uint64_t>(k));
    out.push_back(rows(ids));
    out.back().first_row = first + i;
  }
  return out;
}

// The models this rank holds, measured from their tensors (trained: weights,
// gradients, AdamW's moments; frozen: weights), beside the planner's RL ledger
// for the same model in fp32 (plan/posttrain.h). Printed after the first step
// (when gradients exist) and logged as mem_* in that step's metrics.
void report_memory(const TrainConfig& c, TrainEngine& actor, TrainEngine* critic, Transformer* reward, int dp,
                   int64_t rows, bool lead, nlohmann::json& j) {
  auto weights = [](Transformer* m) {
    double b = 0;
    if (m) {
      for (const auto& p : m->params().params()) b += static_cast<double>(p.tensor.numel() * p.tensor.element_size());
    }
    return b;
  };
  std::vector<std::pair<std::string, double>> measured{{"actor (trained)", static_cast<double>(actor.measure().state())}};
  if (critic) measured.push_back({"critic (trained)", static_cast<double>(critic->measure().state())});
  if (actor.reference()) {
    measured.push_back({"reference (frozen)", weights(actor.reference())});
    j["mem_reference"] = measured.back().second;
  }
  if (reward) {
    measured.push_back({"reward (frozen)", weights(reward)});
    j["mem_reward"] = measured.back().second;
  }
  j["mem_actor"] = measured[0].second;
  if (critic) j["mem_critic"] = measured[1].second;
  if (!lead) return;
  plan::StageLedger planned;
  try {
    plan::Strategy s;
    s.tp = c.tp, s.dp = dp, s.precision = plan::Precision::Fp32, s.micro_batch = c.micro_batch;
    s.seq = c.model.seq, s.global_batch = c.micro_batch * dp;
    const plan::RlhfOptions o{rows, c.model.seq - rl_settings(c).max_new, rl_settings(c).max_new};
    planned = c.method == "ppo" ? plan::rlhf_ledger(c.model, s, o) : plan::grpo_ledger(c.model, s, o, actor.reference());
  } catch (const std::exception& e) {
    fmt::print("memory: no plan for this model ({})\n", e.what());
  }
  fmt::print("memory per rank: measured | planned (meshtrain plan --method {} --precision fp32)\n", c.method);
  for (const auto& [name, bytes] : measured) {
    double plan_bytes = 0;
    for (const auto& line : planned.lines) plan_bytes = line.item == name ? line.bytes : plan_bytes;
    fmt::print("  {:<20} {:>12} | {}\n", name, plan::human_bytes(bytes),
               plan_bytes > 0 ? plan::human_bytes(plan_bytes) : std::string("-"));
  }
}

}  // namespace

int train_rl(const TrainConfig& c, Runtime& rt, const RewardFn* reward) {
  const RewardFn task_fn = task_reward_fn();
  const RewardFn& score = reward ? *reward : task_fn;
  const bool ppo = c.method == "ppo";
  auto layout = MeshLayout::create(rt.world_size(), {{"tp", c.tp}, {"cp", 1}, {"pp", 1}});
  DeviceMesh mesh(rt, layout);
  Comm& dp = mesh.group({"dp", "cp"});
  const bool lead = rt.rank() == 0;
  const int64_t P = c.global_batch, G = rl_settings(c).group;
  if (P % dp.size() != 0) {
    throw std::invalid_argument(fmt::format("train.global_batch {} prompts do not divide over {} data-parallel ranks", P,
                                            dp.size()));
  }
  const auto prompts = read_task_examples(rl_settings(c).prompts);
  std::vector<TaskExample> eval;
  if (!rl_settings(c).eval.empty()) {
    eval = read_task_examples(rl_settings(c).eval);
    if (static_cast<int64_t>(eval.size()) > rl_settings(c).eval_examples) eval.resize(rl_settings(c).eval_examples);
  }
  TrainEngine engine(c, rt, mesh, 1, lead);
  // PPO's critic: the same trunk (from the same [init] weights) with a value
  // head, trained by its own engine at ppo.critic_lr.
  TrainConfig critic_config = c;
  if (ppo_settings(c).critic_lr > 0) critic_config.optim.lr = ppo_settings(c).critic_lr;
  std::unique_ptr<TrainEngine> critic;
  if (ppo) critic = std::make_unique<TrainEngine>(critic_config, rt, mesh, 1, false, EngineRole::Critic);
  // The saver first: it takes the directory's lock and recovers what a crash left.
  std::unique_ptr<ckpt::Checkpointer> saver = checkpoint_saver(c, rt);
  const std::string resumed = resume_path(c, mesh.world(), rt.env().restart);
  std::optional<ckpt::Pin> init;  // pinned (ckpt/pin.h)
  if (!c.init_from.empty()) {
    init = starting_weights(c, resumed);
    ckpt::Reader r(init->step_dir);
    if (resumed.empty() || adapter_checkpoints(c)) {
      engine.load_weights(r);
      if (critic) critic->load_weights(r);
    }
    engine.load_reference(r);
    if (lead && resumed.empty()) fmt::print("weights from {} (step {})\n", r.dir(), r.manifest().value("step", 0));
  }
  // The loss-spike detector watches the actor's updates (policy log; skip and rollback are refused for RL).
  SpikeDefence spike(c.spike, 1, static_cast<uint64_t>(P));
  // Resume: the actor and its moments, the critic's under "critic/", the detector. Rollouts are a
  // function of (seed, step, rank) and prompts of (seed, position): nothing else to restore.
  int64_t start = 0;
  if (!resumed.empty()) {
    ckpt::Reader r(resumed, c.ckpt_staging_mb << 20);
    const auto& m = r.manifest();
    const std::string method = m.at("config").at("train").value("method", std::string());
    if (method != c.method) {
      throw std::invalid_argument(fmt::format("checkpoint {} is of train.method = \"{}\", this run's is \"{}\": use "
                                              "another checkpoint.dir, or checkpoint.resume = \"none\"",
                                              resumed, method, c.method));
    }
    start = m.at("step").get<int64_t>();
    engine.load(r);
    if (critic) {
      r.set_prefix("critic/");
      critic->load(r);
    }
    spike.restore(m.value("spike", nlohmann::json()), false);
    if (lead) fmt::print("resumed from {} (step {})\n", resumed, start);
  }
  const int64_t last = c.stop_after > 0 ? std::min(c.stop_after, c.steps) : c.steps;
  auto& objective = dynamic_cast<GrpoObjective&>(engine.objective());
  // A learned reward model (frozen, tensor-parallel like the policy): the fourth model of PPO (RLHF).
  const std::unique_ptr<Transformer> reward_model =
      rl_settings(c).reward_model.empty() ? nullptr : load_reward_model(rl_settings(c).reward_model, engine.model().tp_comm());
  const std::unique_ptr<Environment> env = make_environment(rl_settings(c).environment);
  Transformer& model = engine.model();
  const int64_t mine = P / dp.size(), first = dp.rank() * mine;
  if (lead) {
    fmt::print("{} on {} ({} prompts): {} prompts per step x {} completions, {} per data-parallel rank; epsilon "
               "{}/{}, {} epoch(s) per rollout; ",
               ppo ? "PPO" : "GRPO", rl_settings(c).task, prompts.size(), P, G, mine * G, rl_settings(c).epsilon, rl_settings(c).epsilon_high,
               rl_settings(c).epochs);
    if (ppo) {
      fmt::print("critic with a value head, KL penalty {} ({}) in the reward, GAE gamma {} lambda {}, value clip {}\n",
                 ppo_settings(c).kl_coef, ppo_settings(c).kl_estimator, ppo_settings(c).gamma, ppo_settings(c).lambda, ppo_settings(c).value_clip);
    } else {
      fmt::print("loss {}, beta {}\n", grpo_settings(c).loss, grpo_settings(c).beta);
    }
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
    // Greedy, and sampled at the rollout temperature (what RL optimises).
    const TaskScore e = evaluate_task(model, eval, rl_settings(c).max_new, 64, 0, 0, env.get(), rl_settings(c).max_turns);
    const TaskScore sampled =
        evaluate_task(model, eval, rl_settings(c).max_new, 64, rl_settings(c).temperature, c.seed, env.get(), rl_settings(c).max_turns);
    if (lead) {
      fmt::print("step {:>5} | held-out accuracy {:.3f} greedy ({}/{}), {:.3f} sampled at temperature {} | mean "
                 "reward {:.3f}\n",
                 s, e.accuracy(), e.exact, e.examples, sampled.accuracy(), rl_settings(c).temperature, e.reward);
      j["eval_accuracy"] = e.accuracy();
      j["eval_sampled_accuracy"] = sampled.accuracy();
      j["eval_reward"] = e.reward;
    }
  };
  if (start == 0) {
    nlohmann::json j{{"step", 0}};
    evaluate(0, j);
    if (lead && metrics.is_open()) metrics << j.dump() << "\n" << std::flush;
  }
  std::map<uint64_t, std::vector<size_t>> perms;
  for (int64_t s = start + 1; s <= last; ++s) {
    // Rollouts: this rank's prompts, G completions each.
    const auto t0 = Clock::now();
    std::vector<size_t> which(static_cast<size_t>(mine));
    for (int64_t k = 0; k < mine; ++k) {
      which[k] = prompt_at(static_cast<uint64_t>((s - 1) * P + first + k), prompts.size(), c.seed, perms);
    }
    std::vector<double> rewards;
    const std::vector<Episode> eps = collect(model, c, s, first, prompts, which, score, env.get(), rt.rank(), rewards);
    RolloutBatch b = episode_batch(eps, CharVocab::end());
    const int64_t R = static_cast<int64_t>(eps.size());
    if (reward_model) {
      // The learned reward model's score of each whole episode replaces the task's reward.
      std::vector<int64_t> last;
      for (const Episode& e : eps) last.push_back(static_cast<int64_t>(e.prompt.size() + e.generated.size()) - 1);
      const at::Tensor scores = score_rows(*reward_model, b.tokens, at::tensor(last, at::kLong)).to(at::kDouble).contiguous();
      rewards.assign(scores.data_ptr<double>(), scores.data_ptr<double>() + R);
    }
    const double rollout_s = seconds_since(t0);
    const auto t1 = Clock::now();
    double exact = 0, length = 0, turns = 0, truncated = 0;
    for (int64_t i = 0; i < R; ++i) {
      exact += task_reward(eps[i].answer, prompts[which[i / G]]).exact > 0;
      length += static_cast<double>(std::count(eps[i].policy.begin(), eps[i].policy.end(), 1));
      turns += static_cast<double>(eps[i].turns);
      truncated += eps[i].truncated;
    }
    double kl_sum = 0;
    if (!ppo) {
      b.advantages = group_advantages(at::tensor(rewards, at::kDouble), G).to(at::kFloat);
    } else {
      at::NoGradGuard no_grad;
      const double t = rl_settings(c).temperature;
      at::Tensor ref = b.old_logp;  // kl_coef = 0: no penalty, no reference
      if (ppo_settings(c).kl_coef > 0) {
        if (Transformer* frozen = engine.reference()) {
          ref = token_logprobs(*frozen, b.tokens, t, CharVocab::size(), false);
        } else {
          enable_lora(model, false);  // LoRA: the reference is the policy with its adapters off
          ref = token_logprobs(model, b.tokens, t, CharVocab::size(), false);
          enable_lora(model, true);
        }
      }
      kl_sum = ((b.old_logp - ref) * b.mask).sum().item<double>();
      const int64_t T = b.tokens.size(1) - 1;
      const at::Tensor old_values = values(critic->model(), b.tokens, false).narrow(1, 0, T);
      const at::Tensor shaped = kl_shaped_rewards(b.old_logp, ref, b.mask, at::tensor(rewards, at::kDouble).to(at::kFloat),
                                                  ppo_settings(c).kl_coef, parse_kl_estimator(ppo_settings(c).kl_estimator));
      const Gae g = gae(shaped, old_values, b.mask, ppo_settings(c).gamma, ppo_settings(c).lambda);
      if (ppo_settings(c).whiten) {
        at::Tensor moments = masked_moments(g.advantages, b.mask);
        dp.all_reduce(moments);  // the global batch's mean and variance
        b.advantages = masked_whiten(g.advantages, b.mask, moments);
      } else {
        b.advantages = g.advantages;
      }
      dynamic_cast<ValueObjective&>(critic->objective()).set_batch({b.tokens, old_values, g.returns, b.mask});
    }
    objective.set_rollouts(b);
    // Optimisation: rl.epochs steps over the rollout batch (actor, then critic).
    StepResult r, rc;
    nlohmann::json spike_event;
    for (int64_t e = 0; e < rl_settings(c).epochs; ++e) {
      // Each of the rl.epochs updates is an optimizer step of its own (its own dropout masks).
      const int64_t update = (s - 1) * rl_settings(c).epochs + e + 1;
      r = engine.step(update,
                      micro_batches(R, c.micro_batch, dp.rank() * R, [&](const auto& ids) { return objective.rows(ids); }),
                      spike.gate());
      if (spike.spiked()) {
        spike_event = spike.note(s, r, "trained on (policy log)");
        if (lead) fmt::print("step {:>5} | {}\n", s, spike_line(spike_event));
      }
      if (critic) {
        auto& value = dynamic_cast<ValueObjective&>(critic->objective());
        rc = critic->step(update, micro_batches(R, c.micro_batch, dp.rank() * R,
                                                [&](const auto& ids) { return value.rows(ids); }));
      }
    }
    const double train_s = seconds_since(t1);
    // Reward statistics over the global batch.
    const at::Tensor rw = at::tensor(rewards, at::kDouble);
    at::Tensor sums = at::tensor(std::vector<double>{rw.sum().item<double>(), (rw * rw).sum().item<double>(), exact,
                                                     length, static_cast<double>(R), kl_sum, turns, truncated},
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
    if (s == 1) report_memory(c, engine, critic.get(), reward_model.get(), dp.size(), R, lead, j);
    if (env) {
      j["turns"] = sums[6].item<double>() / n;
      j["truncated"] = sums[7].item<double>() / n;
    }
    if (ppo) {
      // The penalty's k1 KL of the rollout policy to the reference, per policy token.
      j["kl"] = sums[3].item<double>() > 0 ? sums[5].item<double>() / sums[3].item<double>() : 0.0;
      j["value_loss"] = rc.loss;
      for (const auto& [name, value] : rc.metrics) j[name] = value;
    }
    if (lead && (s % c.log_every == 0 || s == 1 || s == c.steps)) {
      fmt::print("step {:>5} | reward {:.3f} +- {:.3f} | accuracy {:.3f} | length {:.1f}{} | loss {:.4f} | kl {:.4f} | "
                 "clip {:.3f}/{:.3f} | entropy {:.3f}{} | rollout {:.2f} s | train {:.2f} s\n",
                 s, mean, sd, j["accuracy"].get<double>(), j["completion_length"].get<double>(),
                 env ? fmt::format(" | turns {:.2f} ({:.0f}% truncated)", j["turns"].get<double>(),
                                   100 * j["truncated"].get<double>())
                     : "",
                 r.loss,
                 j.value("kl", 0.0), j.value("clip_low", 0.0), j.value("clip_high", 0.0), j.value("entropy", 0.0),
                 ppo ? fmt::format(" | value loss {:.4f} clip {:.3f}", rc.loss, j.value("value_clipped", 0.0)) : "",
                 rollout_s, train_s);
    }
    if (!spike_event.is_null()) j["spike"] = spike_event;
    if (s % c.eval_every == 0 || s == c.steps) evaluate(s, j);
    if (lead && metrics.is_open()) metrics << j.dump() << "\n" << std::flush;
    if (saver) saver->poll();  // an async save completes (or fails, on every rank) here
    if (saver && ((c.ckpt_every > 0 && s % c.ckpt_every == 0) || s == last)) {
      nlohmann::json fields = common_checkpoint_fields(c, init ? &*init : nullptr);
      fields.update({{"spike", spike.state()},
                     {"mesh", {{"tp", c.tp}, {"pp", 1}, {"dp", dp.size()}, {"cp", 1}}},
                     {"optimizer", {{"steps", engine.optimizer().steps()}}}});
      std::vector<ckpt::Piece> pieces = engine.pieces(adapter_checkpoints(c));
      if (critic) {
        for (auto& p : critic->pieces(adapter_checkpoints(c))) {
          p.name = "critic/" + p.name;
          pieces.push_back(std::move(p));
        }
      }
      saver->save(s, std::move(pieces), fields, nlohmann::json::object());
      spike.saved(s);
      if (lead) fmt::print("step {:>5} | checkpoint {}/{}\n", s, c.ckpt_dir, ckpt::step_dir_name(s));
    }
  }
  if (saver) {
    saver->finish();
    mesh.world().barrier();
  }
  return 0;
}

}  // namespace meshtrain
