// The hang report: what the ranks' flight records (flight_recorder.h) say
// about a failed or stuck job. Read by the launcher after a rank fails and by
// `meshtrain diagnose hang DIR`.
//
// The stuck call is the first call any rank recorded as failed (else the
// oldest one still in flight). A member of its group that has no record of it
// is behind: it never arrived (no record at all: it could not answer, e.g.
// stopped or hung in the kernel; else its last calls say where it is). The
// first divergence is the first sequence number of a group at which two ranks
// recorded different calls.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "meshtrain/comm/flight_recorder.h"

namespace meshtrain {

struct RankRecord {
  int rank = -1;
  std::string reason;  // why it was written
  std::vector<FlightGroup> groups;
  std::vector<FlightEntry> calls;
};

// Every rank_*.json in `dir`; a file that does not parse is skipped, named in `problems`.
std::vector<RankRecord> read_flight_records(const std::string& dir, std::vector<std::string>* problems = nullptr);

struct HangReport {
  std::string text;         // the whole report, lines ending in '\n'
  std::vector<int> behind;  // ranks that never arrived at the stuck call
  std::string blame;        // one line naming them and the call ("" when nothing is known)
};

// `world`: the job's ranks; `states`: what is known of a rank's process
// beyond its record (the launcher's view: "stopped (SIGSTOP)", "exited with code 1").
// `ranks_per_node` > 0 (a job over several nodes): each rank without a record is named with
// its node (rank / ranks_per_node), so a lost node is named (its records are on its host).
HangReport hang_report(const std::vector<RankRecord>& records, int world, const std::map<int, std::string>& states = {},
                       int ranks_per_node = 0);

}  // namespace meshtrain
