#include "meshtrain/runtime/env.h"

#include <cstdlib>
#include <stdexcept>

#include <fmt/format.h>

namespace meshtrain {
namespace {

using Getenv = std::function<std::optional<std::string>(const std::string&)>;

std::optional<std::string> process_getenv(const std::string& name) {
  const char* v = std::getenv(name.c_str());
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

int parse_int(const std::string& name, const std::string& value, int min_value) {
  size_t used = 0;
  long v = 0;
  try {
    v = std::stol(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != value.size() || v < min_value || v > 1 << 30) {
    throw std::invalid_argument(fmt::format(
        "environment variable {}='{}' is not an integer >= {}; fix the launcher or unset it", name,
        value, min_value));
  }
  return static_cast<int>(v);
}

// Reads `name` or throws, telling which launcher was detected and why it needs it.
std::string require(const Getenv& get, const std::string& name, const std::string& why) {
  auto v = get(name);
  if (!v || v->empty()) {
    throw std::invalid_argument(fmt::format(
        "environment variable {} is missing ({}); start ranks with `meshtrain launch`, "
        "torchrun, srun or mpirun, or set it",
        name, why));
  }
  return *v;
}

void check_ranks(const DistEnv& e) {
  if (e.rank >= e.world_size) {
    throw std::invalid_argument(fmt::format("rank {} is not below world size {} ({} variables)",
                                            e.rank, e.world_size, e.source));
  }
  if (e.local_rank >= e.local_world_size) {
    throw std::invalid_argument(fmt::format("local rank {} is not below local world size {} ({} variables)",
                                            e.local_rank, e.local_world_size, e.source));
  }
}

int master_port_or_default(const Getenv& get) {
  auto p = get("MASTER_PORT");
  return p ? parse_int("MASTER_PORT", *p, 1) : 29500;
}

}  // namespace

int slurm_tasks_on_node(const std::string& name, const std::string& value, int node) {
  std::vector<int> counts;
  size_t at = 0;
  while (at < value.size()) {
    const size_t end = value.find(',', at);
    const std::string item = value.substr(at, end == std::string::npos ? std::string::npos : end - at);
    at = end == std::string::npos ? value.size() : end + 1;
    const size_t paren = item.find("(x");
    const int count = parse_int(name, item.substr(0, paren), 1);
    int times = 1;
    if (paren != std::string::npos) {
      if (item.back() != ')') throw std::invalid_argument(fmt::format("{}='{}': '{}' is not N(xM)", name, value, item));
      times = parse_int(name, item.substr(paren + 2, item.size() - paren - 3), 1);
    }
    for (int i = 0; i < times && counts.size() <= static_cast<size_t>(node); ++i) counts.push_back(count);
  }
  if (node < 0 || static_cast<size_t>(node) >= counts.size()) {
    throw std::invalid_argument(fmt::format("{}='{}' has no count for node {} (SLURM_NODEID)", name, value, node));
  }
  return counts[static_cast<size_t>(node)];
}

std::vector<std::string> expand_slurm_nodelist(const std::string& list) {
  // Split at top-level commas (commas inside [...] are ranges), expand each entry's first bracket group, recurse.
  std::vector<std::string> out;
  size_t start = 0;
  int depth = 0;
  for (size_t i = 0; i <= list.size(); ++i) {
    if (i < list.size() && list[i] == '[') ++depth;
    if (i < list.size() && list[i] == ']') --depth;
    if (depth < 0) throw std::invalid_argument(fmt::format("Slurm node list '{}' has an unmatched ']'", list));
    if (i < list.size() && (list[i] != ',' || depth > 0)) continue;
    const std::string entry = list.substr(start, i - start);
    start = i + 1;
    if (entry.empty()) continue;
    const size_t open = entry.find('['), close = entry.find(']');
    if (open == std::string::npos) {
      out.push_back(entry);
      continue;
    }
    if (close == std::string::npos || close < open) {
      throw std::invalid_argument(fmt::format("Slurm node list '{}' has an unmatched '['", list));
    }
    const std::string prefix = entry.substr(0, open), ranges = entry.substr(open + 1, close - open - 1),
                      rest = entry.substr(close + 1);
    std::vector<std::string> names;  // "01-03,07" -> 01 02 03 07, keeping the zero padding
    size_t r0 = 0;
    for (size_t j = 0; j <= ranges.size(); ++j) {
      if (j < ranges.size() && ranges[j] != ',') continue;
      const std::string range = ranges.substr(r0, j - r0);
      r0 = j + 1;
      const size_t dash = range.find('-');
      const std::string lo = range.substr(0, dash), hi = dash == std::string::npos ? lo : range.substr(dash + 1);
      if (lo.empty() || hi.empty() || lo.find_first_not_of("0123456789") != std::string::npos ||
          hi.find_first_not_of("0123456789") != std::string::npos || std::stoll(hi) < std::stoll(lo)) {
        throw std::invalid_argument(fmt::format("Slurm node list '{}': '{}' is not a range of numbers", list, range));
      }
      for (long long n = std::stoll(lo); n <= std::stoll(hi); ++n) {
        names.push_back(fmt::format("{:0{}}", n, lo.size()));
      }
    }
    const std::vector<std::string> tails = rest.empty() ? std::vector<std::string>{""} : expand_slurm_nodelist(rest);
    for (const auto& n : names) {
      for (const auto& tail : tails) out.push_back(prefix + n + tail);
    }
  }
  return out;
}

DistEnv DistEnv::from_environment(const Getenv& getenv_fn) {
  const Getenv get = getenv_fn ? getenv_fn : Getenv(process_getenv);
  DistEnv e;
  if (get("RANK") || get("WORLD_SIZE")) {
    e.source = "launch";
    const char* why = "meshtrain launch and torchrun set it with RANK";
    e.rank = parse_int("RANK", require(get, "RANK", why), 0);
    e.world_size = parse_int("WORLD_SIZE", require(get, "WORLD_SIZE", why), 1);
    auto lr = get("LOCAL_RANK");
    e.local_rank = lr ? parse_int("LOCAL_RANK", *lr, 0) : e.rank;
    auto lws = get("LOCAL_WORLD_SIZE");
    e.local_world_size = lws ? parse_int("LOCAL_WORLD_SIZE", *lws, 1) : e.world_size;
    if (e.world_size > 1) e.master_addr = require(get, "MASTER_ADDR", why);
    else if (auto a = get("MASTER_ADDR")) e.master_addr = *a;
    e.master_port = master_port_or_default(get);
    if (auto f = get("MESHTRAIN_STORE_FILE")) e.store_file = *f;
    if (auto r = get("MESHTRAIN_RESTART_COUNT")) {
      e.restart = parse_int("MESHTRAIN_RESTART_COUNT", *r, 0);
    } else if (auto t = get("TORCHELASTIC_RESTART_COUNT")) {
      e.restart = parse_int("TORCHELASTIC_RESTART_COUNT", *t, 0);
    }
  } else if (get("SLURM_PROCID") && get("SLURM_STEP_NUM_TASKS")) {
    // A task of an srun step. The step's own variables (SLURM_NTASKS and SLURM_TASKS_PER_NODE
    // are the allocation's, which a step may use part of); outside a step (an sbatch script
    // itself) SLURM_PROCID is set but no step variable: one process, which may launch ranks.
    e.source = "slurm";
    const char* why = "srun sets it for every task of a step";
    e.rank = parse_int("SLURM_PROCID", require(get, "SLURM_PROCID", why), 0);
    e.world_size = parse_int("SLURM_STEP_NUM_TASKS", require(get, "SLURM_STEP_NUM_TASKS", why), 1);
    e.local_rank = parse_int("SLURM_LOCALID", require(get, "SLURM_LOCALID", why), 0);
    const int node = parse_int("SLURM_NODEID", require(get, "SLURM_NODEID", why), 0);
    e.local_world_size =
        slurm_tasks_on_node("SLURM_STEP_TASKS_PER_NODE", require(get, "SLURM_STEP_TASKS_PER_NODE", why), node);
    // Rank 0 runs on the step's first node, not on the host srun was typed on (often a login node).
    if (auto a = get("MASTER_ADDR")) {
      e.master_addr = *a;
    } else if (auto nodes = get("SLURM_STEP_NODELIST") ? get("SLURM_STEP_NODELIST")
                            : get("SLURM_JOB_NODELIST") ? get("SLURM_JOB_NODELIST")
                                                        : get("SLURM_NODELIST")) {
      const auto hosts = expand_slurm_nodelist(*nodes);
      if (hosts.empty()) throw std::invalid_argument(fmt::format("Slurm node list '{}' names no node", *nodes));
      e.master_addr = hosts.front();
    } else {
      e.master_addr = require(get, "SLURM_LAUNCH_NODE_IPADDR", "or set MASTER_ADDR to rank 0's host");
    }
    e.master_port = master_port_or_default(get);
  } else if (get("OMPI_COMM_WORLD_RANK")) {
    e.source = "openmpi";
    const char* why = "mpirun sets it for every process";
    e.rank = parse_int("OMPI_COMM_WORLD_RANK", require(get, "OMPI_COMM_WORLD_RANK", why), 0);
    e.world_size = parse_int("OMPI_COMM_WORLD_SIZE", require(get, "OMPI_COMM_WORLD_SIZE", why), 1);
    e.local_rank = parse_int("OMPI_COMM_WORLD_LOCAL_RANK", require(get, "OMPI_COMM_WORLD_LOCAL_RANK", why), 0);
    e.local_world_size =
        parse_int("OMPI_COMM_WORLD_LOCAL_SIZE", require(get, "OMPI_COMM_WORLD_LOCAL_SIZE", why), 1);
    if (auto a = get("MASTER_ADDR")) e.master_addr = *a;
    else if (e.local_world_size != e.world_size)
      e.master_addr = require(get, "MASTER_ADDR", "mpirun over several nodes: export rank 0's host with -x MASTER_ADDR");
    e.master_port = master_port_or_default(get);
  } else {
    return e;  // not launched: one process
  }
  check_ranks(e);
  return e;
}

}  // namespace meshtrain
