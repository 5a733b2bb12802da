// fuzz_parsers: the parsers that live beside libtorch (checkpoints, configs,
// HF config.json, flight records) under ASan + UBSan. See fuzz.h.
#include "fuzz.h"
#include "meshtrain/methods/builtin.h"

std::vector<fuzz::Target> ckpt_targets();
std::vector<fuzz::Target> config_targets();

int main(int argc, char** argv) {
  meshtrain::register_builtin_methods();  // so configs of every method reach their checks
  std::vector<fuzz::Target> all = ckpt_targets();
  for (auto& t : config_targets()) all.push_back(std::move(t));
  return fuzz::run_targets(argc, argv, std::move(all));
}
