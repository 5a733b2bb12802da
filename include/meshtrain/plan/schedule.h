// Pipeline schedules as data (seed 000 articles 09 and 13): for every pipeline
// rank, the ordered list of what it does in one step. The executor runs the
// lists; the checker simulates them first.
//
// Stages: the model is cut into S = pp x v stages; rank r holds the virtual
// stages r, r + pp, ..., r + (v-1) pp (Megatron's interleaving, arXiv
// 2104.04473 sec. 2.2; v = 1: one stage per rank). Micro-batch m flows
// forward through stages 0..S-1 and its gradient back through S-1..0.
//
// Builders:
//   GPipe        all forwards, then all backwards (Huang et al., arXiv 1811.06965)
//   1F1B         p - r - 1 warm-up forwards, then one forward / one backward,
//                then the remaining backwards (PipeDream-Flush; Narayanan et al.)
//   Interleaved  1F1B over v virtual stages per rank (needs m % pp == 0)
//   ZB-H1        the backward split into input gradient (B) and weight
//                gradient (W); B first, W whenever a rank would otherwise
//                wait, at most p - r micro-batches in flight as in 1F1B
//                (Qi et al., arXiv 2401.10241 sec. 3, "ZB-H1"; built by list
//                scheduling with T_F = T_B = T_W, the paper's setting)
// Communication is explicit: a Send after a compute action whose output lives
// on another rank, a Recv before a compute action whose input does.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "meshtrain/plan/strategy.h"

namespace meshtrain::plan {

enum class Op {
  Forward,        // F: forward of (micro, stage)
  Backward,       // B: input gradient (and, unless split, weight gradient)
  BackwardWeight, // W: weight gradient (split backward only)
  SendAct, RecvAct,   // activation of (micro, stage) to / from the rank of stage + 1 / - 1
  SendGrad, RecvGrad  // gradient of (micro, stage) to / from the rank of stage - 1 / + 1
};
const char* to_string(Op op);

struct Action {
  Op op;
  int micro = 0;
  int stage = 0;  // the virtual stage this action belongs to (for sends: the producing stage)
  int peer = -1;  // Send/Recv: the other rank
  bool operator==(const Action& o) const {
    return op == o.op && micro == o.micro && stage == o.stage && peer == o.peer;
  }
};
std::string describe(const Action& a);  // "F m3 s1", "send act m3 s1 -> rank 2"

struct PipelineSchedule {
  Schedule kind = Schedule::OneFOneB;
  int pp = 1, micro = 1, virtual_stages = 1;
  bool split_backward = false;  // W actions exist
  std::vector<std::vector<Action>> ranks;
  int stages() const { return pp * virtual_stages; }
  int rank_of(int stage) const { return stage % pp; }
};

// Throws std::invalid_argument naming the value: pp, micro or v < 1;
// interleaved with v < 2 or micro % pp != 0.
PipelineSchedule build_schedule(Schedule kind, int pp, int micro, int virtual_stages = 1);

// Time of one action in units of a forward pass of one stage.
struct ActionCosts {
  double forward = 1, backward = 2;  // backward = B + W when not split
  double backward_input = 1, backward_weight = 1;
  // Per (virtual) stage: a factor on its actions' costs, its work relative to a
  // stage of cost 1 (unequal stages: the slowest sets the pace). Empty: all 1.
  std::vector<double> stage_scale;
};

class ScheduleError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct SimulationResult {
  double makespan = 0;                 // time of the whole step
  std::vector<double> busy;            // compute time per rank
  std::vector<int> peak_in_flight;     // micro-batches whose forward ran and backward (B) did not, per rank and stage-slot
  double bubble_fraction = 0;          // 1 - mean(busy) / makespan
  // Rank r's idle share of the step: 1 - busy[r] / makespan (bubble_fraction where the stages are equal).
  double idle_fraction(int r) const { return makespan > 0 ? 1 - busy.at(static_cast<size_t>(r)) / makespan : 0; }
  std::vector<std::vector<std::pair<double, Action>>> start_times;  // per rank, compute actions with their start
};

// Checks the schedule and runs it in simulated time (sends never block;
// a receive waits for its send). ScheduleError names the rank and the action
// when: a compute action repeats or is missing, its input is not there yet
// and no receive brings it, a send has no receive (or the reverse), or the
// ranks wait on each other (a cycle: nothing can run).
SimulationResult simulate(const PipelineSchedule& s, const ActionCosts& c = {});

// The timeline as text: one row per rank, one column per time unit.
std::string timeline(const PipelineSchedule& s, const SimulationResult& r, const ActionCosts& c = {});

}  // namespace meshtrain::plan
