#include "meshtrain/data/preference.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace meshtrain {

nlohmann::json preference_conversation(const nlohmann::json& pair, bool chosen) {
  if (!pair.is_object()) throw std::invalid_argument("a preference pair must be {\"prompt\", \"chosen\", \"rejected\"}");
  for (const char* key : {"chosen", "rejected"}) {
    if (!pair.contains(key) || !pair[key].is_string()) {
      throw std::invalid_argument(fmt::format("a preference pair needs a string \"{}\"", key));
    }
  }
  if (!pair.contains("prompt") || !(pair["prompt"].is_string() || pair["prompt"].is_array())) {
    throw std::invalid_argument("a preference pair needs a \"prompt\": a string or a list of messages");
  }
  nlohmann::json messages = pair["prompt"].is_string()
                                ? nlohmann::json::array({{{"role", "user"}, {"content", pair["prompt"]}}})
                                : pair["prompt"];
  messages.push_back({{"role", "assistant"}, {"content", pair[chosen ? "chosen" : "rejected"]}});
  return {{"messages", messages}};
}

PackedChats pack_pairs(const std::vector<TokenizedChat>& alternating, int64_t seq, uint32_t pad, bool truncate) {
  if (alternating.size() % 2 != 0) throw std::invalid_argument("pack_pairs: chosen and rejected sequences alternate");
  for (const TokenizedChat& c : alternating) {
    // Position 0 is no position's target: the answer needs a trained token in 1..seq-1.
    const auto end = c.mask.begin() + std::min<int64_t>(seq, static_cast<int64_t>(c.mask.size()));
    if (std::find(c.mask.begin() + std::min<int64_t>(1, end - c.mask.begin()), end, 1u) == end) {
      throw std::invalid_argument(fmt::format("the pair on line {}: its prompt fills --seq {}, leaving no answer token "
                                              "to train; shorten the prompt or raise --seq",
                                              c.line, seq));
    }
  }
  return pack_chats(alternating, seq, pad, truncate, /*one_per_block=*/true);
}

}  // namespace meshtrain
