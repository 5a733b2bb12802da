#include "meshtrain/comm/hang_report.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>

namespace meshtrain {
namespace {

CallKind kind_of(const std::string& op) {
  for (CallKind k : {CallKind::AllReduce, CallKind::AllGather, CallKind::ReduceScatter, CallKind::Broadcast,
                     CallKind::AllToAll, CallKind::Barrier, CallKind::Send, CallKind::Recv}) {
    if (op == to_string(k)) return k;
  }
  return CallKind::None;
}

CallState state_of(const std::string& s) {
  return s == "completed" ? CallState::Completed : s == "failed" ? CallState::Failed : CallState::Started;
}

bool collective(const FlightEntry& e) { return e.call.kind != CallKind::Send && e.call.kind != CallKind::Recv; }

const std::string& group_name(const RankRecord& r, int g) {
  static const std::string unknown = "?";
  return g >= 0 && g < static_cast<int>(r.groups.size()) ? r.groups[g].name : unknown;
}

std::string where(const RankRecord& r, const FlightEntry& e) {
  return fmt::format("{} on group '{}'", describe_call(e.call), group_name(r, e.group));
}

// The stuck call: the first failed collective (by start time), else the oldest in flight.
std::optional<std::pair<const RankRecord*, const FlightEntry*>> stuck_call(const std::vector<RankRecord>& records) {
  std::optional<std::pair<const RankRecord*, const FlightEntry*>> failed, started;
  for (const auto& r : records) {
    for (const auto& e : r.calls) {
      if (!collective(e) || e.state == CallState::Completed) continue;
      auto& slot = e.state == CallState::Failed ? failed : started;
      if (!slot || e.start < slot->second->start) slot = std::make_pair(&r, &e);
    }
  }
  return failed ? failed : started;
}

}  // namespace

std::vector<RankRecord> read_flight_records(const std::string& dir, std::vector<std::string>* problems) {
  namespace fs = std::filesystem;
  std::vector<RankRecord> out;
  std::error_code ec;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("rank_", 0) == 0 && e.path().extension() == ".json") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  for (const auto& f : files) {
    try {
      std::ifstream in(f);
      const auto j = nlohmann::json::parse(in);
      RankRecord r;
      r.rank = j.at("rank").get<int>();
      r.reason = j.value("reason", "");
      for (const auto& g : j.at("groups")) r.groups.push_back({g.at("name"), g.at("ranks").get<std::vector<int>>()});
      for (const auto& c : j.at("calls")) {
        FlightEntry e;
        e.id = c.at("id");
        e.group = c.at("group");
        e.call.seq = c.at("seq");
        e.call.kind = kind_of(c.at("op"));
        e.call.dtype = c.at("dtype");
        e.call.numel = c.at("numel");
        e.call.root = c.at("root");
        e.call.reduce = c.at("reduce");
        e.start = c.at("start");
        e.end = c.at("end");
        e.state = state_of(c.at("state"));
        r.calls.push_back(e);
      }
      out.push_back(std::move(r));
    } catch (const std::exception& e) {
      if (problems) problems->push_back(fmt::format("{}: {}", f.string(), e.what()));
    }
  }
  return out;
}

HangReport hang_report(const std::vector<RankRecord>& records, int world, const std::map<int, std::string>& states,
                       int ranks_per_node) {
  auto node = [ranks_per_node](int rank) {
    return ranks_per_node > 0 ? fmt::format("node {}; ", rank / ranks_per_node) : std::string();
  };
  HangReport rep;
  std::map<int, const RankRecord*> by_rank;
  for (const auto& r : records) by_rank[r.rank] = &r;
  rep.text += fmt::format("flight records of {} of {} ranks\n", by_rank.size(), world);
  for (int rank = 0; rank < world; ++rank) {
    const auto it = by_rank.find(rank);
    const auto st = states.find(rank);
    const std::string state = st == states.end() ? "" : fmt::format(" (process {})", st->second);
    if (it == by_rank.end()) {
      rep.text += fmt::format("  rank {}: no record{}\n", rank, state);
      continue;
    }
    const RankRecord& r = *it->second;
    if (r.calls.empty()) {
      rep.text += fmt::format("  rank {}: no calls recorded{}\n", rank, state);
      continue;
    }
    const FlightEntry& last = r.calls.back();
    rep.text += fmt::format("  rank {}: last call {} ({}{}){}\n", rank, where(r, last), to_string(last.state),
                            last.end > 0 ? fmt::format(", {:.3f} s", last.end - last.start) : "", state);
  }
  // The first call at which two ranks' records of one group differ.
  std::map<std::pair<std::string, uint64_t>, std::pair<int, const FlightEntry*>> seen;
  std::optional<std::string> divergence;
  double divergence_at = 0;
  for (const auto& r : records) {
    for (const auto& e : r.calls) {
      if (!collective(e)) continue;
      const auto key = std::make_pair(group_name(r, e.group), e.call.seq);
      const auto [it, fresh] = seen.emplace(key, std::make_pair(r.rank, &e));
      if (fresh || it->second.second->call == e.call) continue;
      if (!divergence || e.start < divergence_at) {
        divergence_at = e.start;
        divergence = fmt::format("first divergence: group '{}' sequence {}: rank {} called {}, rank {} called {}\n",
                                 key.first, key.second, it->second.first, describe_call(it->second.second->call),
                                 r.rank, describe_call(e.call));
      }
    }
  }
  if (divergence) rep.text += *divergence;
  const auto stuck = stuck_call(records);
  if (!stuck) return rep;
  const RankRecord& waiter = *stuck->first;
  const FlightEntry& call = *stuck->second;
  const FlightGroup* group = call.group >= 0 && call.group < static_cast<int>(waiter.groups.size())
                                 ? &waiter.groups[call.group]
                                 : nullptr;
  if (group == nullptr) return rep;
  std::vector<std::string> why;
  for (int member : group->ranks) {
    const auto it = by_rank.find(member);
    const auto st = states.find(member);
    const std::string state = st == states.end() ? "" : fmt::format("process {}; ", st->second);
    if (it == by_rank.end()) {
      rep.behind.push_back(member);
      why.push_back(fmt::format("rank {} ({}{}no flight record)", member, node(member), state));
      continue;
    }
    const RankRecord& r = *it->second;
    const FlightEntry* last_here = nullptr;
    bool arrived = false;
    for (const auto& e : r.calls) {
      if (!collective(e) || group_name(r, e.group) != group->name) continue;
      if (e.call.seq >= call.call.seq) arrived = true;
      last_here = &e;
    }
    if (arrived) continue;
    rep.behind.push_back(member);
    const FlightEntry* last = r.calls.empty() ? nullptr : &r.calls.back();
    why.push_back(fmt::format(
        "rank {} ({}its last call on that group: {}; its last call: {})", member, state,
        last_here ? fmt::format("sequence {} ({})", last_here->call.seq, to_string(last_here->state)) : "none",
        last ? fmt::format("{} ({})", where(r, *last), to_string(last->state)) : "none"));
  }
  const std::string at = fmt::format("{} on group '{}' (rank {} {} there)", describe_call(call.call), group->name,
                                     waiter.rank, call.state == CallState::Failed ? "failed" : "waits");
  if (rep.behind.empty()) {
    rep.text += fmt::format("stuck call: {}; every rank of the group reached it\n", at);
    return rep;
  }
  rep.blame = fmt::format("{} never arrived at {}", fmt::join(why, ", "), at);
  rep.text += "behind: " + rep.blame + "\n";
  return rep;
}

}  // namespace meshtrain
