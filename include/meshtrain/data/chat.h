// Supervised fine-tuning data: chat conversations rendered through a template,
// tokenized, and packed whole into fixed-length blocks with a loss mask.
//
// Input: JSONL, one conversation per line: {"messages": [{"role": "system" |
// "user" | "assistant", "content": "..."}, ...]}.
//
// The template (every marker configurable; the defaults below): each message is
//   HEADER(role) + content + END
// with HEADER = "<|system|>\n", "<|user|>\n", "<|assistant|>\n" and END =
// "<|end|>\n". Trained tokens (mask 1): an assistant message's content and its
// END (so the model learns to stop); everything else (headers, system and user
// messages) has mask 0: zero loss, zero gradient.
//
// Packing: conversations are laid whole, in order, into blocks of `seq`
// tokens; a conversation that does not fit in what is left of a block starts
// the next one, and the rest is padding (pad id, mask 0, a document of its
// own). Every block therefore starts a conversation and no conversation is cut,
// so with train.document_mask each one attends only to itself, with positions
// from 0 — the same per-conversation losses as unpacked. A conversation longer
// than `seq` is an error naming its line, or is truncated when asked.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace meshtrain {

struct ChatTemplate {
  std::string system = "<|system|>\n", user = "<|user|>\n", assistant = "<|assistant|>\n", end = "<|end|>\n";
};

struct ChatSegment {
  std::string text;
  bool train = false;
};

// Throws std::invalid_argument naming the problem (no "messages" list, an
// unknown role, a message without string content, no assistant message, a
// content holding one of the template's markers, which would make it ambiguous).
std::vector<ChatSegment> render_chat(const nlohmann::json& conversation, const ChatTemplate& t = {});

// The inverse: {"messages": [...]} from a rendered conversation's text (the
// segments joined). Throws std::invalid_argument where the text does not
// follow the template.
nlohmann::json parse_chat(const std::string& text, const ChatTemplate& t = {});

struct TokenizedChat {
  std::vector<uint32_t> ids;
  std::vector<uint32_t> mask;  // 1: trained (as a target), 0: not
  int64_t line = 0;            // in the input, for errors
};

struct PackedChats {
  std::vector<uint32_t> tokens, mask;
  std::vector<uint64_t> doc_starts;  // every conversation and every padding run
  uint64_t conversations = 0, padding = 0, truncated = 0, trained = 0;
};

// Reads a JSON-lines file of conversations (or, with `pairs`, of preference
// pairs: data/preference.h, two conversations each, chosen then rejected) and
// tokenizes each segment with `encode` (mask 1 where the template trains).
// Blank lines are skipped. Throws std::invalid_argument naming the file and
// line, or a file that holds none.
std::vector<TokenizedChat> read_chats(const std::string& path, bool pairs,
                                      const std::function<std::vector<int>(const std::string&)>& encode);

// Packs into blocks of `seq` tokens (see above); `pad` fills the rest of a block.
// With `one_per_block`, every conversation starts a block of its own (DPO's
// layout, data/preference.h).
PackedChats pack_chats(const std::vector<TokenizedChat>& chats, int64_t seq, uint32_t pad, bool truncate,
                       bool one_per_block = false);

}  // namespace meshtrain
