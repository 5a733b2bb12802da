// Training methods as plug-ins (torchtitan's train specs): what the trainer
// core asks of a method, and the table it finds them in.
//
// The core (train/) names no method it does not own: it looks the run's
// train.method up here and calls the hooks a method gives. train/ registers
// the methods it holds (pretrain, sft); a method in a folder above registers
// itself (dpo/method.h: dpo; rl/methods.h: reward, grpo, ppo), through one line
// in methods/builtin.cpp, so a new method touches its own folder and that line. A hook left
// empty means the core's default, written beside it.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace meshtrain {

class Objective;
class Runtime;
class Transformer;
struct TrainConfig;
enum class EngineRole;

struct Method {
  std::string name;     // train.method's value
  std::string summary;  // one line, for the list of methods
  // The config sections only the methods listing them read ("dpo"; "rl", "grpo"): a key of such a
  // section given to a method that does not list it is one error, not silently ignored.
  std::vector<std::string> sections;
  // Trains on [data] token shards (data.train or data.sources), which must then be given.
  // false: the method brings its own data (RL's prompts) and refuses them.
  bool token_data = true;
  // Its examples are pairs of sequences (a chosen and a rejected completion): the loader reads
  // two rows an example, and a step's tokens count both.
  bool pairs = false;
  // Its shards carry a loss mask and were packed to train.seq by `meshtrain tokenize <tokenize>`,
  // which records the length in `packed_info` beside each ({"sft.json", "chat"}). Empty: documents.
  std::string packed_info, tokenize;
  // Checks in the launching process of what the run reads (task files, checkpoints) against the
  // mesh's `dp` data ranks (std::invalid_argument naming the key). Empty: none. A method without
  // token data has no other data checks.
  std::function<void(const TrainConfig&, int dp)> check_start;
  // Settings checks in the launching process, after the core's (std::invalid_argument naming the
  // key, prefixed with `path`). Empty: none.
  std::function<void(const TrainConfig&, const std::string& path)> check;
  // What a role's model needs on the trunk, after adapters (a value head). Empty: nothing.
  std::function<void(const TrainConfig&, EngineRole, Transformer&)> prepare_model;
  // Whether a role keeps a frozen copy of the starting model as its reference. Empty: no.
  std::function<bool(const TrainConfig&, EngineRole)> copy_reference;
  // A role's objective; `reference`: the frozen copy, or null. Empty: next-token loss.
  std::function<std::unique_ptr<Objective>(const TrainConfig&, EngineRole, Transformer* reference)> objective;
  // A method with a loop of its own (rollouts, then updates) runs the whole
  // training here and returns the exit code. Empty: the trainer's loop over data.
  std::function<int(const TrainConfig&, Runtime&)> run;
};

// Adds `m`; std::logic_error when its name is taken.
void register_method(Method m);
// The method of that name, or null.
const Method* find_method(const std::string& name);
// The method of that name; std::invalid_argument listing the registered ones otherwise.
const Method& method_named(const std::string& name);
// Registered names, in registration order.
std::vector<std::string> method_names();
// The methods (quoted names) that list `section` in their Method::sections; empty for a section
// every method reads.
std::vector<std::string> methods_reading(const std::string& section);
// Whether train.method `name` trains on pairs of sequences (Method::pairs; false for a name not registered).
bool pairwise(const std::string& name);
// Whether the run of method `m` reads `section`: every method reads the common sections.
bool reads_section(const Method& m, const std::string& section);

}  // namespace meshtrain
