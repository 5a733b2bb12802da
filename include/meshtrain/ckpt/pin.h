// Pinning a run's starting weights (train's [init] from) to one checkpoint.
//
// `from` may name a directory of checkpoints, which resolve() reads as its
// newest step: a base run that trains on would hand a later export, resume,
// sample or eval another model than the one the adapters were trained on. So
// a run pins `from` when it starts: the absolute step directory it resolved
// to and the XXH64 of that step's manifest.json (which holds every shard's
// checksum, so it names the weights). Its checkpoints record the pin ("init";
// an adapter checkpoint's frozen base also as "base"), and everything that
// loads them loads that step or fails with one error naming the checkpoint,
// the pinned step and what changed. A pin written before pins existed
// ({"from"} alone) resolves `from` as it always did.
#pragma once

#include <string>

#include <nlohmann/json_fwd.hpp>

namespace meshtrain::ckpt {

struct Pin {
  std::string from;            // as the config gave it
  std::string step_dir;        // absolute; "" in a pin written before pins existed
  std::string manifest_xxh64;  // of step_dir/manifest.json's bytes
};

// `from` resolved now and its manifest hashed (throws what resolve() throws).
Pin pin(const std::string& from);
nlohmann::json to_json(const Pin& p);

// The pin in `field` of the checkpoint `owner`, checked against the disk:
// throws std::runtime_error naming both when the step directory is gone or its
// manifest hashes otherwise.
Pin pinned(const nlohmann::json& field, const std::string& owner);

}  // namespace meshtrain::ckpt
