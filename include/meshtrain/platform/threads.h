// Thread counts and the process environment of one rank.
//
// PLATFORM.md: with libgomp's default spin-wait, 4 ranks on 2 cores run 3-7x
// slower; OMP_WAIT_POLICY must be PASSIVE before libgomp loads (setenv in main is
// too late), and glibc's malloc tunables (2-4x on CPU training) are read at
// start-up too (mallopt sets the same for the running process). So the launcher
// exports them to its children, and ranks started by srun/mpirun re-execute
// themselves once with them set.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace meshtrain {

// OMP_NUM_THREADS when set, else max(1, online cores / ranks on this node).
int threads_per_rank(int local_world_size);

// at::set_num_threads, one inter-op thread, OpenBLAS's own pool (which
// ignores at::set_num_threads), and MKL's vector math set up on every thread
// (platform/vector_math_warmup.h).
void configure_threads(int local_world_size);

// The variables a rank needs at load time and does not have yet:
// OMP_WAIT_POLICY=PASSIVE, OMP_NUM_THREADS, OPENBLAS_NUM_THREADS, GLIBC_TUNABLES.
std::vector<std::pair<std::string, std::string>> missing_rank_environment(int local_world_size);

// The malloc tunables' effect set with mallopt for this process (unless GLIBC_TUNABLES
// is set): no allocation mmapped, the heap never trimmed.
void keep_freed_memory();

// keep_freed_memory(); then, for one of several ranks on this node (srun/mpirun started
// it without the launcher's variables), if some of those variables are missing, sets
// them and execs this program again with the same arguments (returns only when
// nothing was missing or exec failed). One process alone on its node does not re-exec.
void reexec_with_rank_environment(char** argv, int local_world_size);

}  // namespace meshtrain
