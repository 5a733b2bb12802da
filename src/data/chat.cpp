#include "meshtrain/data/chat.h"

#include <fmt/format.h>

#include <fstream>
#include <stdexcept>

#include "meshtrain/data/preference.h"

namespace meshtrain {

std::vector<ChatSegment> render_chat(const nlohmann::json& conversation, const ChatTemplate& t) {
  if (!conversation.is_object() || !conversation.contains("messages") || !conversation["messages"].is_array()) {
    throw std::invalid_argument("a conversation must be {\"messages\": [{\"role\": ..., \"content\": ...}, ...]}");
  }
  std::vector<ChatSegment> out;
  bool answered = false;
  for (const auto& m : conversation["messages"]) {
    const std::string role = m.is_object() ? m.value("role", "") : "";
    if (!m.is_object() || !m.contains("content") || !m["content"].is_string()) {
      throw std::invalid_argument(fmt::format("a message without string \"content\" (role \"{}\")", role));
    }
    const std::string content = m["content"].get<std::string>();
    for (const std::string* marker : {&t.system, &t.user, &t.assistant, &t.end}) {
      if (content.find(*marker) != std::string::npos) {
        throw std::invalid_argument(fmt::format("a {} message's content holds the template marker \"{}\"", role, *marker));
      }
    }
    if (role == "assistant") {
      out.push_back({t.assistant, false});
      out.push_back({content + t.end, true});
      answered = true;
    } else if (role == "user" || role == "system") {
      out.push_back({(role == "user" ? t.user : t.system) + content + t.end, false});
    } else {
      throw std::invalid_argument(fmt::format("unknown role \"{}\"; use system, user or assistant", role));
    }
  }
  if (!answered) throw std::invalid_argument("a conversation without an assistant message has nothing to train");
  return out;
}

nlohmann::json parse_chat(const std::string& text, const ChatTemplate& t) {
  nlohmann::json messages = nlohmann::json::array();
  size_t pos = 0;
  while (pos < text.size()) {
    std::string role;
    for (const auto& [name, header] : {std::pair{"system", &t.system}, {"user", &t.user}, {"assistant", &t.assistant}}) {
      if (text.compare(pos, header->size(), *header) == 0) {
        role = name;
        pos += header->size();
        break;
      }
    }
    if (role.empty()) throw std::invalid_argument(fmt::format("no role header at offset {} of the chat text", pos));
    const size_t end = text.find(t.end, pos);
    if (end == std::string::npos) throw std::invalid_argument(fmt::format("the {} message at offset {} has no end marker", role, pos));
    messages.push_back({{"role", role}, {"content", text.substr(pos, end - pos)}});
    pos = end + t.end.size();
  }
  return {{"messages", messages}};
}

std::vector<TokenizedChat> read_chats(const std::string& path, bool pairs,
                                      const std::function<std::vector<int>(const std::string&)>& encode) {
  std::ifstream in(path);
  if (!in) throw std::invalid_argument(fmt::format("cannot read {}", path));
  std::vector<TokenizedChat> chats;
  int64_t line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      const nlohmann::json j = nlohmann::json::parse(line);
      // A pair is two conversations, chosen then rejected.
      std::vector<nlohmann::json> conversations{j};
      if (pairs) conversations = {preference_conversation(j, true), preference_conversation(j, false)};
      for (const auto& conversation : conversations) {
        TokenizedChat c;
        c.line = line_no;
        for (const auto& seg : render_chat(conversation)) {
          for (int id : encode(seg.text)) {
            c.ids.push_back(static_cast<uint32_t>(id));
            c.mask.push_back(seg.train ? 1 : 0);
          }
        }
        chats.push_back(std::move(c));
      }
    } catch (const std::exception& e) {
      throw std::invalid_argument(fmt::format("{} line {}: {}", path, line_no, e.what()));
    }
  }
  if (chats.empty()) throw std::invalid_argument(fmt::format("{} holds no {}", path, pairs ? "pair" : "conversation"));
  return chats;
}

PackedChats pack_chats(const std::vector<TokenizedChat>& chats, int64_t seq, uint32_t pad, bool truncate,
                       bool one_per_block) {
  if (seq < 2) throw std::invalid_argument(fmt::format("--seq {} must be at least 2", seq));
  PackedChats p;
  const uint64_t block = static_cast<uint64_t>(seq);
  auto pad_block = [&] {
    const uint64_t used = p.tokens.size() % block;
    if (used == 0) return;
    p.doc_starts.push_back(p.tokens.size());
    for (uint64_t i = used; i < block; ++i) {
      p.tokens.push_back(pad);
      p.mask.push_back(0);
      ++p.padding;
    }
  };
  for (const TokenizedChat& c : chats) {
    uint64_t n = c.ids.size();
    if (n > block) {
      if (!truncate) {
        throw std::invalid_argument(fmt::format("conversation on line {} has {} tokens, more than --seq {}; shorten "
                                                "it, raise --seq, or pass --truncate",
                                                c.line, n, seq));
      }
      n = block;
      ++p.truncated;
    }
    if (one_per_block || p.tokens.size() % block + n > block) pad_block();
    p.doc_starts.push_back(p.tokens.size());
    p.tokens.insert(p.tokens.end(), c.ids.begin(), c.ids.begin() + static_cast<int64_t>(n));
    p.mask.insert(p.mask.end(), c.mask.begin(), c.mask.begin() + static_cast<int64_t>(n));
    for (uint64_t i = 0; i < n; ++i) p.trained += c.mask[i];
    ++p.conversations;
  }
  pad_block();
  // The loader's windows are block-aligned and read one token past the block
  // (the target of the last position): one closing pad block-token keeps the last block whole.
  p.doc_starts.push_back(p.tokens.size());
  p.tokens.push_back(pad);
  p.mask.push_back(0);
  return p;
}

}  // namespace meshtrain
