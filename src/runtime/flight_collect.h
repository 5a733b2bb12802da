// Internal to the launcher: the flight records of a failed job
// (comm/flight_recorder.h). Ranks write them to a directory the launcher
// gives them; when one fails, the launcher asks the live ones for theirs
// (SIGUSR1) before it stops them, and notes which cannot answer.
#pragma once

#include <sys/types.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace meshtrain {

// The directory the ranks write their records to: $MESHTRAIN_FLIGHT_DIR when
// the user set it (kept), else a fresh one under $TMPDIR (`owned` = true).
std::string flight_directory(bool* owned);
// Removes the records of an earlier attempt.
void clear_flight_records(const std::string& dir);

// Asks every live rank (rank, pid) that catches SIGUSR1 for its record and
// waits up to `wait_s` for them; returns what is known of each live rank's
// process ("stopped (SIGSTOP or a debugger)", "running", ...).
std::map<int, std::string> collect_flight_records(const std::vector<std::pair<int, pid_t>>& alive,
                                                  const std::string& dir, double wait_s);

}  // namespace meshtrain
