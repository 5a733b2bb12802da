// Crash points: named places where a process can be made to die (or hang) at
// once, as a kill -9, a power cut or a stalled device would stop it there. The
// crash-consistency tests set
//
//   MESHTRAIN_CRASH_AT="<point>[@<k>] [rank=<r>] [signal=KILL|STOP|SLEEP]"
//
// (the k-th time the point is reached, default the first; on rank r only, by
// the RANK variable, default every rank; SIGKILL by default, SIGSTOP to stop
// the process, SLEEP to stop only the calling thread: the process still
// answers signals, as a rank stuck in a long computation would)
// and check that what the process left behind is recovered, or that the hang
// is found. RocksDB's TEST_KILL_RANDOM and LevelDB's fault-injection tests are
// the model. Unset, a crash point costs one comparison.
#pragma once

namespace meshtrain {

// Sends this process MESHTRAIN_CRASH_AT's signal when it names `name`, this
// rank, and this is the k-th time the point is reached (thread-safe). A
// malformed MESHTRAIN_CRASH_AT is std::invalid_argument naming it and the syntax.
void crash_point(const char* name);

}  // namespace meshtrain
