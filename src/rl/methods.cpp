#include "meshtrain/rl/methods.h"

#include <fmt/format.h>

#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>

#include "meshtrain/ckpt/checkpoint.h"
#include "meshtrain/data/tasks.h"
#include "meshtrain/plan/spec_json.h"
#include "meshtrain/platform/subprocess.h"
#include "meshtrain/rl/config_keys.h"
#include "meshtrain/rl/critic.h"
#include "meshtrain/rl/environment.h"
#include "meshtrain/rl/grpo.h"
#include "meshtrain/rl/grpo_objective.h"
#include "meshtrain/rl/ppo.h"
#include "meshtrain/rl/reward_model.h"
#include "meshtrain/rl/rl_trainer.h"
#include "meshtrain/rl/settings.h"
#include "meshtrain/train/config.h"
#include "meshtrain/train/config_keys.h"
#include "meshtrain/train/engine.h"
#include "meshtrain/train/method.h"
#include "meshtrain/train/state.h"

namespace meshtrain {
namespace {

// train.method = "grpo" | "ppo": the [rl], [grpo] and [ppo] settings.
void check_rl(const TrainConfig& c, const std::string& path) {
  const auto& r = rl_settings(c);
  const std::string& m = c.method;
  if (r.prompts.empty()) throw std::invalid_argument(fmt::format("{}: train.method = \"{}\" needs rl.prompts", path, m));
  if (m == "grpo" && r.group < 2) {
    throw std::invalid_argument(fmt::format("{}: rl.group = {}: GRPO's baseline is the group's mean reward, so it "
                                            "needs at least 2 completions per prompt (PPO's critic works with 1)",
                                            path, r.group));
  }
  if (!r.reward_command.empty() && !r.reward_shell) {
    try {
      command_words(r.reward_command, "rl.reward_command");
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(fmt::format("{}: {} (or set rl.reward_shell = true)", path, e.what()));
    }
  }
  if (!r.reward_command.empty() && !r.reward_model.empty()) {
    throw std::invalid_argument(fmt::format("{}: rl.reward_command and rl.reward_model both set: the reward comes from "
                                            "one of them (or, with neither, from the task)",
                                            path));
  }
  if (r.max_turns < 1) throw std::invalid_argument(fmt::format("{}: rl.max_turns = {} must be >= 1", path, r.max_turns));
  try {
    make_environment(r.environment);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(fmt::format("{}: rl.environment: {}", path, e.what()));
  }
  if (r.task != "arithmetic" && r.task != "reverse") {
    throw std::invalid_argument(fmt::format("{}: rl.task = \"{}\": use \"arithmetic\" or \"reverse\" (the shipped "
                                            "tasks; other rewards through rl.reward_command)",
                                            path, r.task));
  }
  if (c.ep > 1) {
    throw std::invalid_argument(fmt::format("{}: parallel.ep = {} with train.method = \"{}\": reinforcement learning "
                                            "runs on tp x dp meshes; set parallel.ep = 1",
                                            path, c.ep, c.method));
  }
  if (c.spike.policy == SpikePolicy::Skip || c.spike.policy == SpikePolicy::Rollback) {
    throw std::invalid_argument(fmt::format("{}: spike.policy = \"{}\": skip and rollback act on training on data "
                                            "(pretrain, sft, dpo, reward); train.method = \"{}\" logs spikes of the "
                                            "actor's updates only: set spike.policy = \"log\" or \"off\"",
                                            path, spike_policy_name(c.spike.policy), c.method));
  }
  if (c.sp || c.pp > 1 || c.cp > 1 || c.zero > 0 || c.lora_quantize != "none") {
    throw std::invalid_argument(fmt::format("{}: train.method = \"{}\" runs on data and tensor parallelism (DDP, "
                                            "no sequence parallelism) for now: parallel.sp must be false, pp and cp "
                                            "1, zero 0, lora.quantize \"none\" (they are {}, {}, {}, {}, \"{}\")",
                                            path, m, c.sp, c.pp, c.cp, c.zero, c.lora_quantize));
  }
  // The keys of training on data that an RL run has no use for: one error each, not silence.
  const std::pair<bool, std::string> unused[] = {
      {c.check_replicas_every > 0,
       fmt::format("check.replicas_every = {}: the replica check runs in training on data; set it to 0",
                   c.check_replicas_every)},
      {!c.eval_tasks.empty(), "eval.tasks: an RL run scores its held-out prompts (rl.eval); drop eval.tasks"},
      {!c.val_shards.empty(), "data.val: an RL run has no token data to validate on (its held-out set is rl.eval); "
                              "drop data.val"},
      {!c.train_shards.empty() || !c.sources.empty(),
       "data.train / data.sources: an RL run trains on rl.prompts' rollouts; drop the token data"}};
  for (const auto& [set, why] : unused) {
    if (set) throw std::invalid_argument(fmt::format("{}: train.method = \"{}\" with {}", path, m, why));
  }
  try {
    parse_grpo_loss(grpo_settings(c).loss);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(fmt::format("{}: grpo.loss: {}", path, e.what()));
  }
  const auto& p = ppo_settings(c);
  try {
    parse_kl_estimator(p.kl_estimator);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(fmt::format("{}: ppo.kl_estimator: {}", path, e.what()));
  }
}

// The policy's objective: GRPO's clipped surrogate; PPO's actor the same over every policy token
// (dapo's token mean) with per-token advantages and the KL in the reward instead (rl/ppo.h).
std::unique_ptr<Objective> policy_objective(const TrainConfig& c, Transformer* reference) {
  const bool ppo = c.method == "ppo";
  GrpoOptions g;
  g.epsilon_low = rl_settings(c).epsilon, g.epsilon_high = rl_settings(c).epsilon_high, g.beta = ppo ? 0.0 : grpo_settings(c).beta;
  g.loss = ppo ? GrpoLoss::Dapo : parse_grpo_loss(grpo_settings(c).loss);
  g.kl_ratio = !ppo && grpo_settings(c).kl_ratio;
  g.max_completion = rl_settings(c).max_new;
  return std::make_unique<GrpoObjective>(g, rl_settings(c).temperature, CharVocab::size(), reference);
}

// What GRPO and PPO share: rl.prompts instead of token shards, the [rl] checks, the rollout loop.
// What an RL run reads, checked before ranks start: the task's prompts (and held-out examples),
// the starting and reward checkpoints; a step's prompts split over the `dp` data ranks.
void check_rl_start(const TrainConfig& c, int dp) {
  read_task_examples(rl_settings(c).prompts);
  if (!rl_settings(c).eval.empty()) read_task_examples(rl_settings(c).eval);
  if (c.model.vocab < CharVocab::size()) {
    throw std::invalid_argument(fmt::format("model.vocab {} is smaller than the task vocabulary ({} characters)",
                                            c.model.vocab, CharVocab::size()));
  }
  if (c.global_batch % dp != 0) {
    throw std::invalid_argument(fmt::format("train.global_batch {} prompts do not divide over {} data-parallel "
                                            "ranks", c.global_batch, dp));
  }
  if (!c.init_from.empty()) check_same_model(ckpt::Reader(ckpt::resolve(c.init_from)), c.model);
  if (rl_settings(c).reward_model.empty()) return;
  const ckpt::Reader r(ckpt::resolve(rl_settings(c).reward_model));
  if (!r.has("model/value_head.weight")) {
    throw std::invalid_argument(fmt::format("rl.reward_model = {} is not a reward model (it has no value head): "
                                            "train one with train.method = \"reward\"",
                                            rl_settings(c).reward_model));
  }
  const plan::ModelSpec rm = spec_from_json(r.manifest().at("config").at("model"));
  if (rm.vocab < CharVocab::size() || rm.seq < c.model.seq || rm.heads % c.tp != 0 || rm.kv_heads % c.tp != 0) {
    throw std::invalid_argument(fmt::format("rl.reward_model = {}: its model (vocab {}, seq {}, {} heads) must "
                                            "hold the task's {} characters, the policy's sequence of {} and "
                                            "split over tp = {}",
                                            rl_settings(c).reward_model, rm.vocab, rm.seq, rm.heads, CharVocab::size(),
                                            c.model.seq, c.tp));
  }
}

Method rl_method(const char* name, const char* summary) {
  Method m;
  m.name = name;
  m.summary = summary;
  m.token_data = false;
  m.sections = {"rl"};
  m.check = check_rl;
  m.check_start = check_rl_start;
  m.run = [](const TrainConfig& c, Runtime& rt) { return train_rl(c, rt); };
  return m;
}

Method grpo() {
  Method m = rl_method("grpo", "group relative policy optimisation on rl.prompts (rl/grpo.h)");
  m.sections.push_back("grpo");
  // A frozen copy for the KL unless LoRA's adapters can be switched off instead.
  m.copy_reference = [](const TrainConfig& c, EngineRole role) {
    return role == EngineRole::Method && grpo_settings(c).beta > 0 && c.lora.rank == 0;
  };
  m.objective = [](const TrainConfig& c, EngineRole, Transformer* reference) { return policy_objective(c, reference); };
  return m;
}

Method ppo() {
  Method m = rl_method("ppo", "proximal policy optimisation with a critic on rl.prompts (rl/ppo.h)");
  m.sections.push_back("ppo");
  m.prepare_model = [](const TrainConfig&, EngineRole role, Transformer& model) {
    if (role == EngineRole::Critic) add_value_head(model);  // after LoRA, which freezes what came before it
  };
  m.copy_reference = [](const TrainConfig& c, EngineRole role) {
    return role == EngineRole::Method && ppo_settings(c).kl_coef > 0 && c.lora.rank == 0;
  };
  m.objective = [](const TrainConfig& c, EngineRole role, Transformer* reference) -> std::unique_ptr<Objective> {
    if (role == EngineRole::Critic) return std::make_unique<ValueObjective>(ppo_settings(c).value_clip, ppo_settings(c).vf_coef);
    return policy_objective(c, reference);
  };
  return m;
}

Method reward() {
  Method m;
  m.name = "reward";
  m.summary = "a Bradley-Terry reward model on preference pairs (rl/reward_model.h)";
  m.pairs = true;
  m.packed_info = "dpo.json", m.tokenize = "prefs";
  m.check = [](const TrainConfig& c, const std::string& path) {
    if (c.pp > 1 || c.cp > 1 || c.sp) {
      // A sequence's score is one position's value: the sequence whole on one rank, its hidden states whole.
      throw std::invalid_argument(fmt::format("{}: train.method = \"reward\" needs each sequence whole on one rank: "
                                              "parallel.pp and cp must be 1 and sp false (they are {}, {}, {})",
                                              path, c.pp, c.cp, c.sp));
    }
  };
  m.prepare_model = [](const TrainConfig&, EngineRole, Transformer& model) { add_value_head(model); };
  m.objective = [](const TrainConfig&, EngineRole, Transformer*) -> std::unique_ptr<Objective> {
    return std::make_unique<RewardModelObjective>();
  };
  return m;
}

}  // namespace

void register_rl_methods() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_config_keys(rl_config_keys());
    register_method(reward());
    register_method(grpo());
    register_method(ppo());
  });
}

}  // namespace meshtrain
