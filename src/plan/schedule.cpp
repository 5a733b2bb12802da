#include "meshtrain/plan/schedule.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <set>
#include <stdexcept>
#include <tuple>

namespace meshtrain::plan {
namespace {

struct Compute {
  Op op;
  int micro, stage;
};

// Per rank, the order of compute actions of each schedule.
std::vector<Compute> gpipe(int m, int r) {
  std::vector<Compute> out;
  for (int i = 0; i < m; ++i) out.push_back({Op::Forward, i, r});
  for (int i = 0; i < m; ++i) out.push_back({Op::Backward, i, r});
  return out;
}

std::vector<Compute> one_f_one_b(int p, int m, int r) {
  std::vector<Compute> out;
  const int warmup = std::min(p - r - 1, m);
  for (int i = 0; i < warmup; ++i) out.push_back({Op::Forward, i, r});
  for (int i = 0; i < m - warmup; ++i) {
    out.push_back({Op::Forward, warmup + i, r});
    out.push_back({Op::Backward, i, r});
  }
  for (int i = m - warmup; i < m; ++i) out.push_back({Op::Backward, i, r});
  return out;
}

// ZB-H1 by list scheduling in unit time (T_F = T_B = T_W, the paper's
// setting): whenever a rank is free it runs, in this order of preference, the
// next backward B whose gradient has arrived, the next forward whose
// activation has arrived while fewer than p - r micro-batches are in flight
// (1F1B's activation memory, counted as the paper does: B frees most of a
// micro-batch's activations; W keeps only its linear layers' inputs), or a
// pending weight gradient W. W passes have no
// cross-rank dependency, so they fill what would be bubbles; the B chain, the
// critical path, is never delayed by them.
std::vector<std::vector<Compute>> zb_h1(int p, int m) {
  constexpr int kNever = 1 << 30;
  std::vector<std::vector<int>> act(p, std::vector<int>(m, kNever)), grad(p, std::vector<int>(m, kNever));
  for (int i = 0; i < m; ++i) act[0][i] = 0;
  std::vector<int> nf(p, 0), nb(p, 0), in_flight(p, 0);
  std::vector<std::deque<int>> pending(p);
  std::vector<std::vector<Compute>> out(p);
  int left = 3 * m * p;
  for (int t = 0; left > 0; ++t) {
    for (int r = 0; r < p; ++r) {
      if (nb[r] < nf[r] && grad[r][nb[r]] <= t) {
        const int i = nb[r]++;
        out[r].push_back({Op::Backward, i, r});
        if (r > 0) grad[r - 1][i] = t + 1;
        pending[r].push_back(i);
        --in_flight[r];
      } else if (nf[r] < m && in_flight[r] < p - r && act[r][nf[r]] <= t) {
        const int i = nf[r]++;
        out[r].push_back({Op::Forward, i, r});
        (r + 1 < p ? act[r + 1][i] : grad[r][i]) = t + 1;
        ++in_flight[r];
      } else if (!pending[r].empty()) {
        out[r].push_back({Op::BackwardWeight, pending[r].front(), r});
        pending[r].pop_front();
      } else {
        continue;
      }
      --left;
    }
  }
  return out;
}

// Megatron's interleaved 1F1B: forward unit k of rank r is micro-batch
// (k / (p v)) p + k % p on chunk (k / p) % v; backward units visit the chunks
// in reverse. Warm-up: (p - r - 1) * 2 + (v - 1) * p units.
std::vector<Compute> interleaved(int p, int m, int v, int r) {
  std::vector<Compute> out;
  const int units = m * v;
  auto unit = [&](int k, bool forward) {
    const int group = k / (p * v), within = k % (p * v);
    const int chunk = forward ? within / p : v - 1 - within / p;
    return std::pair{group * p + within % p, chunk * p + r};
  };
  const int warmup = std::min((p - r - 1) * 2 + (v - 1) * p, units);
  for (int k = 0; k < warmup; ++k) {
    auto [mb, st] = unit(k, true);
    out.push_back({Op::Forward, mb, st});
  }
  for (int i = 0; i < units - warmup; ++i) {
    auto [fm, fs] = unit(warmup + i, true);
    out.push_back({Op::Forward, fm, fs});
    auto [bm, bs] = unit(i, false);
    out.push_back({Op::Backward, bm, bs});
  }
  for (int k = units - warmup; k < units; ++k) {
    auto [mb, st] = unit(k, false);
    out.push_back({Op::Backward, mb, st});
  }
  return out;
}

using Key = std::tuple<int, int, int, int, int>;  // op (send kind), micro, stage, from, to

Key send_key(const Action& a, int rank) {
  const Op kind = (a.op == Op::SendAct || a.op == Op::RecvAct) ? Op::SendAct : Op::SendGrad;
  const bool send = a.op == Op::SendAct || a.op == Op::SendGrad;
  return {static_cast<int>(kind), a.micro, a.stage, send ? rank : a.peer, send ? a.peer : rank};
}

bool is_compute(Op op) { return op == Op::Forward || op == Op::Backward || op == Op::BackwardWeight; }

}  // namespace

const char* to_string(Op op) {
  switch (op) {
    case Op::Forward: return "F";
    case Op::Backward: return "B";
    case Op::BackwardWeight: return "W";
    case Op::SendAct: return "send act";
    case Op::RecvAct: return "recv act";
    case Op::SendGrad: return "send grad";
    case Op::RecvGrad: return "recv grad";
  }
  return "?";
}

std::string describe(const Action& a) {
  if (is_compute(a.op)) return fmt::format("{} m{} s{}", to_string(a.op), a.micro, a.stage);
  const bool send = a.op == Op::SendAct || a.op == Op::SendGrad;
  return fmt::format("{} m{} s{} {} rank {}", to_string(a.op), a.micro, a.stage, send ? "->" : "<-", a.peer);
}

PipelineSchedule build_schedule(Schedule kind, int pp, int micro, int v) {
  if (pp < 1 || micro < 1 || v < 1) {
    throw std::invalid_argument(fmt::format("pipeline: pp {}, micro-batches {} and virtual stages {} must be >= 1",
                                            pp, micro, v));
  }
  if (kind == Schedule::Interleaved) {
    if (v < 2 || pp < 2) {
      throw std::invalid_argument(fmt::format("interleaved 1F1B needs pp >= 2 and --virtual >= 2 (got pp {}, v {})", pp, v));
    }
    if (micro % pp != 0) {
      throw std::invalid_argument(fmt::format("interleaved 1F1B needs micro-batches ({}) divisible by pp ({})", micro, pp));
    }
  } else if (v != 1) {
    throw std::invalid_argument(fmt::format("{} has one stage per rank; --virtual {} applies to interleaved only",
                                            to_string(kind), v));
  }
  PipelineSchedule s;
  s.kind = kind;
  s.pp = pp;
  s.micro = micro;
  s.virtual_stages = v;
  s.split_backward = kind == Schedule::ZBH1;
  const int S = s.stages();
  const auto zb = kind == Schedule::ZBH1 ? zb_h1(pp, micro) : std::vector<std::vector<Compute>>{};
  for (int r = 0; r < pp; ++r) {
    std::vector<Compute> order;
    switch (kind) {
      case Schedule::GPipe: order = gpipe(micro, r); break;
      case Schedule::OneFOneB: order = one_f_one_b(pp, micro, r); break;
      case Schedule::ZBH1: order = zb[r]; break;
      case Schedule::Interleaved: order = interleaved(pp, micro, v, r); break;
    }
    std::vector<Action> acts;
    for (const Compute& c : order) {
      const int st = c.stage;
      if (c.op == Op::Forward && st > 0 && s.rank_of(st - 1) != r) acts.push_back({Op::RecvAct, c.micro, st - 1, s.rank_of(st - 1)});
      if (c.op == Op::Backward && st < S - 1 && s.rank_of(st + 1) != r) {
        acts.push_back({Op::RecvGrad, c.micro, st + 1, s.rank_of(st + 1)});
      }
      acts.push_back({c.op, c.micro, st, -1});
      if (c.op == Op::Forward && st < S - 1 && s.rank_of(st + 1) != r) acts.push_back({Op::SendAct, c.micro, st, s.rank_of(st + 1)});
      if (c.op == Op::Backward && st > 0 && s.rank_of(st - 1) != r) acts.push_back({Op::SendGrad, c.micro, st, s.rank_of(st - 1)});
    }
    s.ranks.push_back(std::move(acts));
  }
  return s;
}

namespace {

// The simulated time of compute action `a`: its kind's cost times its stage's factor.
double action_cost(const PipelineSchedule& s, const ActionCosts& c, const Action& a) {
  const double scale = c.stage_scale.empty() ? 1.0 : c.stage_scale.at(static_cast<size_t>(a.stage));
  if (a.op == Op::Forward) return scale * c.forward;
  if (a.op == Op::BackwardWeight) return scale * c.backward_weight;
  return scale * (s.split_backward ? c.backward_input : c.backward);
}

}  // namespace

SimulationResult simulate(const PipelineSchedule& s, const ActionCosts& c) {
  const int P = static_cast<int>(s.ranks.size()), S = s.stages();
  if (P != s.pp) throw ScheduleError(fmt::format("schedule has {} rank lists for pp {}", P, s.pp));
  // Static checks: every compute action once, on the right rank; sends and receives paired.
  std::map<std::tuple<int, int, int>, int> seen;  // (op, micro, stage) -> rank
  std::map<Key, int> sends, recvs;
  for (int r = 0; r < P; ++r) {
    for (const Action& a : s.ranks[r]) {
      if (is_compute(a.op)) {
        if (a.stage < 0 || a.stage >= S || a.micro < 0 || a.micro >= s.micro || s.rank_of(a.stage) != r) {
          throw ScheduleError(fmt::format("rank {}: {} does not belong on this rank", r, describe(a)));
        }
        if (!seen.emplace(std::tuple{static_cast<int>(a.op), a.micro, a.stage}, r).second) {
          throw ScheduleError(fmt::format("rank {}: {} appears twice", r, describe(a)));
        }
      } else {
        const bool send = a.op == Op::SendAct || a.op == Op::SendGrad;
        (send ? sends : recvs)[send_key(a, r)] += 1;
      }
    }
  }
  for (int st = 0; st < S; ++st) {
    for (int m = 0; m < s.micro; ++m) {
      std::vector<Op> need{Op::Forward, Op::Backward};
      if (s.split_backward) need.push_back(Op::BackwardWeight);
      for (Op op : need) {
        if (!seen.count({static_cast<int>(op), m, st})) {
          throw ScheduleError(fmt::format("rank {}: {} is missing", s.rank_of(st), describe({op, m, st, -1})));
        }
      }
    }
  }
  for (const auto& [k, n] : sends) {
    if (recvs[k] != n) {
      const auto& [op, m, st, from, to] = k;
      throw ScheduleError(fmt::format("rank {}: {} has no matching receive on rank {}", from,
                                      describe({static_cast<Op>(op), m, st, to}), to));
    }
  }
  for (const auto& [k, n] : recvs) {
    if (sends[k] != n) {
      const auto& [op, m, st, from, to] = k;
      const Op r_op = static_cast<Op>(op) == Op::SendAct ? Op::RecvAct : Op::RecvGrad;
      throw ScheduleError(fmt::format("rank {}: {} has no matching send on rank {}", to, describe({r_op, m, st, from}),
                                      from));
    }
  }
  // Dataflow in simulated time.
  SimulationResult res;
  res.busy.assign(P, 0);
  res.peak_in_flight.assign(P, 0);
  res.start_times.resize(P);
  std::vector<size_t> pc(P, 0);
  std::vector<double> t(P, 0);
  std::vector<int> in_flight(P, 0);
  std::map<Key, double> sent;
  std::set<std::tuple<int, int, int>> done;             // compute (op, micro, stage)
  std::vector<std::set<std::tuple<int, int, int>>> have(P);  // received (kind, micro, stage)
  if (!c.stage_scale.empty() && static_cast<int>(c.stage_scale.size()) != S) {
    throw std::invalid_argument(fmt::format("stage cost factors: {} given, the schedule has {} stages",
                                            c.stage_scale.size(), S));
  }
  auto cost = [&](const Action& a) { return action_cost(s, c, a); };
  for (;;) {
    bool progress = false, all_done = true;
    for (int r = 0; r < P; ++r) {
      while (pc[r] < s.ranks[r].size()) {
        const Action& a = s.ranks[r][pc[r]];
        if (a.op == Op::SendAct || a.op == Op::SendGrad) {
          sent[send_key(a, r)] = t[r];
        } else if (a.op == Op::RecvAct || a.op == Op::RecvGrad) {
          auto it = sent.find(send_key(a, r));
          if (it == sent.end()) break;  // waits for the send
          t[r] = std::max(t[r], it->second);
          have[r].insert({static_cast<int>(a.op == Op::RecvAct ? Op::SendAct : Op::SendGrad), a.micro, a.stage});
        } else {
          // Inputs: a forward needs the previous stage's activation, a
          // backward its own forward and the next stage's gradient, W its B.
          auto input_ok = [&](Op kind, int stage, Op local_op) {
            if (s.rank_of(stage) == r) return done.count({static_cast<int>(local_op), a.micro, stage}) > 0;
            return have[r].count({static_cast<int>(kind), a.micro, stage}) > 0;
          };
          std::string missing;
          if (a.op == Op::Forward && a.stage > 0 && !input_ok(Op::SendAct, a.stage - 1, Op::Forward)) {
            missing = fmt::format("the activation of m{} s{}", a.micro, a.stage - 1);
          }
          if (a.op == Op::Backward) {
            if (!done.count({static_cast<int>(Op::Forward), a.micro, a.stage})) {
              missing = fmt::format("its own forward F m{} s{}", a.micro, a.stage);
            } else if (a.stage < S - 1 && !input_ok(Op::SendGrad, a.stage + 1, Op::Backward)) {
              missing = fmt::format("the gradient of m{} s{}", a.micro, a.stage + 1);
            }
          }
          if (a.op == Op::BackwardWeight && !done.count({static_cast<int>(Op::Backward), a.micro, a.stage})) {
            missing = fmt::format("its input gradient B m{} s{}", a.micro, a.stage);
          }
          if (!missing.empty()) {
            throw ScheduleError(fmt::format("rank {}: {} needs {}, but nothing before it on this rank provides it "
                                            "(a missing receive, or actions out of order)",
                                            r, describe(a), missing));
          }
          res.start_times[r].push_back({t[r], a});
          t[r] += cost(a);
          res.busy[r] += cost(a);
          done.insert({static_cast<int>(a.op), a.micro, a.stage});
          if (a.op == Op::Forward) res.peak_in_flight[r] = std::max(res.peak_in_flight[r], ++in_flight[r]);
          if (a.op == Op::Backward) --in_flight[r];
        }
        ++pc[r];
        progress = true;
      }
      if (pc[r] < s.ranks[r].size()) all_done = false;
    }
    if (all_done) break;
    if (!progress) {
      std::string waits;
      for (int r = 0; r < P; ++r) {
        if (pc[r] < s.ranks[r].size()) {
          waits += fmt::format("{}rank {} waits at {}", waits.empty() ? "" : "; ", r, describe(s.ranks[r][pc[r]]));
        }
      }
      throw ScheduleError("deadlock (the ranks wait on each other in a cycle): " + waits);
    }
  }
  res.makespan = *std::max_element(t.begin(), t.end());
  double mean = 0;
  for (double b : res.busy) mean += b / P;
  res.bubble_fraction = res.makespan > 0 ? 1 - mean / res.makespan : 0;
  return res;
}

std::string timeline(const PipelineSchedule& s, const SimulationResult& r, const ActionCosts& c) {
  const double unit = std::min({c.forward, s.split_backward ? c.backward_input : c.backward,
                                s.split_backward ? c.backward_weight : c.backward}) *
                      (c.stage_scale.empty() ? 1.0 : *std::min_element(c.stage_scale.begin(), c.stage_scale.end()));
  const int cols = static_cast<int>(std::ceil(r.makespan / unit - 1e-9));
  std::string out = fmt::format("{} pp={} micro-batches={}{}: one column = {} forward(s); F forward, B backward{}, "
                                "digits = micro-batch{}, '.' idle\n",
                                to_string(s.kind), s.pp, s.micro,
                                s.virtual_stages > 1 ? fmt::format(" v={}", s.virtual_stages) : "", unit,
                                s.split_backward ? " (input grad), W weight grad" : "",
                                s.virtual_stages > 1 ? ", letter = virtual stage a, b, ..." : "");
  for (size_t rank = 0; rank < s.ranks.size(); ++rank) {
    std::vector<std::string> cells(cols, " . ");
    for (const auto& [start, a] : r.start_times[rank]) {
      const double len = action_cost(s, c, a);
      const int first = static_cast<int>(std::lround(start / unit)), n = static_cast<int>(std::lround(len / unit));
      std::string cell = fmt::format("{}{}", to_string(a.op), a.micro % 10);
      if (s.virtual_stages > 1) cell += static_cast<char>('a' + a.stage / s.pp);
      cell.resize(3, ' ');
      for (int k = first; k < first + n && k < cols; ++k) cells[k] = cell;
    }
    out += fmt::format("rank {:>2} |", rank);
    for (const auto& cell : cells) out += cell;
    out += fmt::format("| busy {:.0f}%, peak in flight {}\n", 100 * r.busy[rank] / r.makespan, r.peak_in_flight[rank]);
  }
  out += fmt::format("step {:.0f} units, bubble {:.1f}% of rank time\n", r.makespan, 100 * r.bubble_fraction);
  return out;
}

}  // namespace meshtrain::plan
