#include "meshtrain/runtime/mesh.h"

#include <algorithm>
#include <numeric>
#include <set>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "meshtrain/comm/comm.h"
#include "meshtrain/runtime/runtime.h"

namespace meshtrain {
namespace {

std::string known_axes() { return fmt::format("{}", fmt::join(MeshLayout::axis_names(), ", ")); }

void check_axis_name(const std::string& axis) {
  const auto& names = MeshLayout::axis_names();
  if (std::find(names.begin(), names.end(), axis) == names.end()) {
    throw std::invalid_argument(fmt::format("unknown mesh axis '{}'; the axes are {}", axis, known_axes()));
  }
}

std::vector<std::string> split_list(const std::string& spec) {
  std::vector<std::string> items;
  std::string cur;
  for (char ch : spec) {
    if (ch == ',' || ch == ' ' || ch == ';') {
      if (!cur.empty()) items.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(ch);
    }
  }
  if (!cur.empty()) items.push_back(cur);
  return items;
}

}  // namespace

const std::vector<std::string>& MeshLayout::axis_names() {
  static const std::vector<std::string> names{"tp", "cp", "ep", "dp", "pp"};
  return names;
}

std::map<std::string, int> MeshLayout::parse(const std::string& spec) {
  std::map<std::string, int> sizes;
  for (const auto& item : split_list(spec)) {
    auto eq = item.find('=');
    if (eq == std::string::npos) {
      throw std::invalid_argument(fmt::format("mesh entry '{}' is not axis=size (e.g. tp=2,dp=2)", item));
    }
    std::string axis = item.substr(0, eq), value = item.substr(eq + 1);
    check_axis_name(axis);
    size_t used = 0;
    int v = -1;
    try {
      v = std::stoi(value, &used);
    } catch (const std::exception&) {
    }
    if (used != value.size() || v < 0) {
      throw std::invalid_argument(fmt::format("mesh size {}='{}' is not a non-negative integer", axis, value));
    }
    if (sizes.count(axis)) throw std::invalid_argument(fmt::format("mesh axis '{}' given twice in '{}'", axis, spec));
    sizes[axis] = v;
  }
  return sizes;
}

std::vector<std::string> MeshLayout::parse_order(const std::string& spec) { return split_list(spec); }

MeshLayout MeshLayout::create(int world_size, const std::map<std::string, int>& sizes,
                              const std::vector<std::string>& order) {
  if (world_size < 1) throw std::invalid_argument(fmt::format("world size {} must be at least 1", world_size));
  MeshLayout m;
  m.world_ = world_size;
  m.order_ = order.empty() ? axis_names() : order;
  std::set<std::string> seen;
  for (const auto& a : m.order_) {
    check_axis_name(a);
    if (!seen.insert(a).second) throw std::invalid_argument(fmt::format("mesh order lists '{}' twice", a));
  }
  if (seen.size() != axis_names().size()) {
    throw std::invalid_argument(fmt::format("mesh order '{}' must list every axis once: {}", fmt::join(m.order_, ","),
                                            known_axes()));
  }
  for (const auto& [a, s] : sizes) check_axis_name(a);
  int others = 1;
  for (const auto& a : m.order_) {
    auto it = sizes.find(a);
    int s = it == sizes.end() ? (a == "dp" ? 0 : 1) : it->second;
    if (a != "dp" && s < 1) throw std::invalid_argument(fmt::format("mesh size {}={} must be at least 1", a, s));
    if (a != "dp") others *= s;
    m.sizes_.push_back(s);
  }
  auto describe_given = [&]() {
    std::vector<std::string> parts;
    for (size_t i = 0; i < m.order_.size(); ++i)
      if (m.sizes_[i] != 1) parts.push_back(fmt::format("{}={}", m.order_[i], m.sizes_[i]));
    return parts.empty() ? std::string("all 1") : fmt::format("{}", fmt::join(parts, " x "));
  };
  int& dp = m.sizes_[m.axis_index("dp")];
  if (dp == 0) {
    if (world_size % others != 0) {
      throw std::invalid_argument(fmt::format(
          "world size {} is not divisible by the mesh's other axes ({} = {}); choose sizes whose product divides {}",
          world_size, describe_given(), others, world_size));
    }
    dp = world_size / others;
  }
  if (others * dp != world_size) {
    throw std::invalid_argument(fmt::format(
        "mesh {} covers {} ranks but the world has {}; make the product of the sizes {} (or leave dp out to "
        "infer it)",
        describe_given(), others * dp, world_size, world_size));
  }
  return m;
}

int MeshLayout::axis_index(const std::string& axis) const {
  auto it = std::find(order_.begin(), order_.end(), axis);
  if (it == order_.end()) throw std::invalid_argument(fmt::format("unknown mesh axis '{}'; the axes are {}", axis, known_axes()));
  return static_cast<int>(it - order_.begin());
}

int MeshLayout::size(const std::string& axis) const { return sizes_[axis_index(axis)]; }

int MeshLayout::coord(int rank, const std::string& axis) const {
  const int idx = axis_index(axis);
  int stride = 1;
  for (int i = 0; i < idx; ++i) stride *= sizes_[i];
  return (rank / stride) % sizes_[idx];
}

std::map<std::string, int> MeshLayout::coords(int rank) const {
  std::map<std::string, int> c;
  for (const auto& a : order_) c[a] = coord(rank, a);
  return c;
}

int MeshLayout::rank_of(const std::map<std::string, int>& c) const {
  int rank = 0, stride = 1;
  for (size_t i = 0; i < order_.size(); ++i) {
    auto it = c.find(order_[i]);
    const int v = it == c.end() ? 0 : it->second;
    if (v < 0 || v >= sizes_[i]) {
      throw std::out_of_range(fmt::format("coordinate {}={} outside 0..{}", order_[i], v, sizes_[i] - 1));
    }
    rank += v * stride;
    stride *= sizes_[i];
  }
  return rank;
}

std::vector<int> MeshLayout::slice(int rank, const std::vector<std::string>& axes) const {
  auto base = coords(rank);
  int count = 1;
  for (const auto& a : axes) count *= size(a);
  std::vector<int> ranks;
  for (int i = 0; i < count; ++i) {
    auto c = base;
    int rest = i;
    for (const auto& a : axes) {
      c[a] = rest % size(a);
      rest /= size(a);
    }
    ranks.push_back(rank_of(c));
  }
  return ranks;
}

std::string MeshLayout::describe() const {
  std::vector<std::string> parts;
  for (size_t i = 0; i < order_.size(); ++i) parts.push_back(fmt::format("{}={}", order_[i], sizes_[i]));
  return fmt::format("{}", fmt::join(parts, " "));
}

std::string MeshLayout::table(int ranks_per_node, int max_rows) const {
  std::ostringstream os;
  os << fmt::format("mesh {} (world {}, order {} fastest first)\n", describe(), world_, fmt::join(order_, ","));
  std::vector<std::string> local, crossing;
  for (const auto& a : order_) {
    if (size(a) == 1) continue;
    bool inside = true;
    for (int r = 0; r < world_ && inside; ++r) {
      for (int peer : slice(r, {a})) inside = inside && (peer / ranks_per_node == r / ranks_per_node);
    }
    (inside ? local : crossing).push_back(a);
  }
  os << fmt::format("  axes inside a node: {}; axes across nodes: {}\n",
                    local.empty() ? "none" : fmt::format("{}", fmt::join(local, ",")),
                    crossing.empty() ? "none" : fmt::format("{}", fmt::join(crossing, ",")));
  os << fmt::format("  {:>6} {:>5}", "rank", "node");
  for (const auto& a : order_) os << fmt::format(" {:>4}", a);
  os << "\n";
  for (int r = 0; r < world_ && r < max_rows; ++r) {
    os << fmt::format("  {:>6} {:>5}", r, r / ranks_per_node);
    for (const auto& a : order_) os << fmt::format(" {:>4}", coord(r, a));
    os << "\n";
  }
  if (world_ > max_rows) os << fmt::format("  ... {} more ranks\n", world_ - max_rows);
  return os.str();
}

// ------------------------------------------------------------- DeviceMesh

std::string DeviceMesh::key(const std::vector<std::string>& axes) { return fmt::format("{}", fmt::join(axes, "+")); }

DeviceMesh::DeviceMesh(Runtime& rt, MeshLayout layout, const std::vector<std::vector<std::string>>& combined)
    : rt_(rt), layout_(std::move(layout)) {
  if (layout_.world_size() != rt.world_size()) {
    throw std::invalid_argument(fmt::format("mesh {} has {} ranks but the job has {}", layout_.describe(),
                                            layout_.world_size(), rt.world_size()));
  }
  // Every rank builds its groups in the same order: the axes in mesh order,
  // then the combinations as listed. (Gloo's group construction is collective
  // among the members, so a different order could deadlock.)
  std::vector<std::vector<std::string>> wanted;
  for (const auto& a : layout_.order()) wanted.push_back({a});
  for (const auto& c : combined) wanted.push_back(c);
  for (const auto& axes : wanted) {
    const std::string k = key(axes);
    if (groups_.count(k)) continue;
    groups_[k] = rt.new_group(layout_.slice(rt.rank(), axes), k);
  }
}

DeviceMesh::~DeviceMesh() = default;

int DeviceMesh::coord(const std::string& axis) const { return layout_.coord(rt_.rank(), axis); }

Comm& DeviceMesh::axis(const std::string& name) { return group({name}); }

Comm& DeviceMesh::group(const std::vector<std::string>& axes) {
  auto it = groups_.find(key(axes));
  if (it == groups_.end()) {
    for (const auto& a : axes) layout_.size(a);  // unknown axis -> clear error
    throw std::invalid_argument(fmt::format("mesh has no group over '{}'; request it when building the mesh",
                                            key(axes)));
  }
  return *it->second;
}

Comm& DeviceMesh::world() { return rt_.world(); }

std::string DeviceMesh::stats_table() const {
  std::ostringstream os;
  os << fmt::format("{:<10} {:<15} {:>8} {:>14} {:>14} {:>14}\n", "group", "op", "calls", "bytes", "wire_bytes",
                    "moved_bytes");
  auto dump = [&](const Comm& c) {
    for (const auto& [op, s] : c.stats())
      os << fmt::format("{:<10} {:<15} {:>8} {:>14} {:>14} {:>14}\n", c.name(), op, s.calls, s.bytes, s.wire_bytes,
                        s.moved_bytes);
  };
  dump(rt_.world());
  for (const auto& [k, c] : groups_) dump(*c);
  return os.str();
}

}  // namespace meshtrain
