// A model's shape as the JSON a checkpoint's manifest holds (config.model):
// the same fields as plan::ModelSpec, norms/positions/activations by name.
#pragma once

#include <nlohmann/json.hpp>

#include "meshtrain/plan/spec.h"

namespace meshtrain {

nlohmann::json spec_to_json(const plan::ModelSpec& m);
// Throws std::invalid_argument naming a missing or wrong field.
plan::ModelSpec spec_from_json(const nlohmann::json& j);

}  // namespace meshtrain
