// The device mesh: ranks arranged on named axes tp, cp, ep, dp, pp.
//
// Layout rule (the seeds' "most frequent traffic on the fastest link"): axes are
// ordered fastest-varying first, by default tp, cp, ep, dp, pp, so
//     rank = c[0] + s[0] * (c[1] + s[1] * (c[2] + ...))
// for coordinates c and sizes s in that order. With ranks numbered node by
// node, tp (the most traffic) then stays inside a node and pp crosses nodes.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace meshtrain {

class Comm;
class Runtime;

// Pure arithmetic, no processes: testable for any world size.
class MeshLayout {
 public:
  static const std::vector<std::string>& axis_names();  // tp cp ep dp pp

  // `sizes` maps axis -> size (absent = 1). A dp of 0 or absent with the other
  // sizes given is inferred as world / product(others). `order` lists every
  // axis once, fastest first (empty = default). Throws std::invalid_argument
  // naming the value and the fix.
  static MeshLayout create(int world_size, const std::map<std::string, int>& sizes,
                           const std::vector<std::string>& order = {});
  // "tp=2,dp=2" or "tp=2 pp=2" -> sizes.
  static std::map<std::string, int> parse(const std::string& spec);
  // "tp,dp,pp,cp,ep" -> order.
  static std::vector<std::string> parse_order(const std::string& spec);

  int world_size() const { return world_; }
  const std::vector<std::string>& order() const { return order_; }
  int size(const std::string& axis) const;
  int coord(int rank, const std::string& axis) const;
  std::map<std::string, int> coords(int rank) const;
  int rank_of(const std::map<std::string, int>& coords) const;

  // Ranks sharing every coordinate of `rank` except those on `axes`, ordered by
  // the combined index of `axes` (first listed axis fastest).
  std::vector<int> slice(int rank, const std::vector<std::string>& axes) const;

  // "tp=2 cp=1 ep=1 dp=2 pp=1".
  std::string describe() const;
  // The start-up table: one row per rank (up to max_rows) with its coordinates,
  // node, and which axes stay inside a node when `ranks_per_node` ranks share one.
  std::string table(int ranks_per_node, int max_rows = 64) const;

 private:
  int axis_index(const std::string& axis) const;
  int world_ = 1;
  std::vector<std::string> order_;
  std::vector<int> sizes_;  // in order_
};

// The layout plus a process group for every axis slice through this rank and
// for the requested combinations (default: dp x cp, the gradient-reduction group).
class DeviceMesh {
 public:
  DeviceMesh(Runtime& rt, MeshLayout layout,
             const std::vector<std::vector<std::string>>& combined = {{"dp", "cp"}});
  ~DeviceMesh();

  const MeshLayout& layout() const { return layout_; }
  int size(const std::string& axis) const { return layout_.size(axis); }
  int coord(const std::string& axis) const;
  Comm& axis(const std::string& name);                   // group along one axis
  Comm& group(const std::vector<std::string>& axes);     // an axis or a combination built at start
  Comm& world();

  // Per-group counters as a table: group, op, calls, bytes, wire bytes.
  std::string stats_table() const;

 private:
  static std::string key(const std::vector<std::string>& axes);
  Runtime& rt_;
  MeshLayout layout_;
  std::map<std::string, std::unique_ptr<Comm>> groups_;
};

}  // namespace meshtrain
