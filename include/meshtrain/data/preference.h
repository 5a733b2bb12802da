// Preference data for DPO (dpo/dpo.h): JSONL, one pair per line,
//   {"prompt": "..." | [messages], "chosen": "...", "rejected": "..."}
// where a string prompt is one user message and a list is the conversation so
// far (data/chat.h's messages). Each answer is rendered through the chat
// template as that conversation plus one assistant message, so only the
// answer's content and its END are trained (mask 1).
//
// Layout (what the loader reads with group = 2): pair k is two blocks of `seq`
// tokens, block 2k its chosen sequence and block 2k+1 its rejected one, each
// starting its block and padded to its end (pack_chats with one_per_block), so a
// sequence's log-probability is the sum of its block's trained targets. A
// sequence longer than `seq` is an error naming its line, or with `truncate`
// loses its end; a prompt that leaves no answer token inside `seq` is an error
// either way.
#pragma once

#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshtrain/data/chat.h"

namespace meshtrain {

// The conversation of `pair` answered by its "chosen" (or "rejected") answer.
// Throws std::invalid_argument naming a missing or non-string field.
nlohmann::json preference_conversation(const nlohmann::json& pair, bool chosen);

// Chosen and rejected sequences, alternating (chosen first), as the tokenizer
// gave them; packed two blocks per pair. Throws naming the line of a pair
// whose prompt leaves its answer no trained token.
PackedChats pack_pairs(const std::vector<TokenizedChat>& alternating, int64_t seq, uint32_t pad, bool truncate);

}  // namespace meshtrain
