// Bytes of tensor storage this process holds on the CPU, counted as libtorch
// allocates and frees them: the CPU's analogue of CUDA's memory_allocated()
// and max_memory_allocated().
//
// install() replaces libtorch's default CPU allocator (c10::SetCPUAllocator,
// above the default's priority) with one that takes its memory where the
// default does (c10::alloc_cpu, the same alignment) and counts it; every
// storage allocated after that is counted until it is freed. What it gives
// up: the default's reports to the autograd profiler's memory view. Storages that
// existed before, and memory libtorch does not allocate as a tensor (BLAS
// workspaces, Gloo's buffers, the malloc arenas' slack), are not: the
// process's resident size (train/memory.h) holds those.
#pragma once

#include <cstdint>

namespace meshtrain::tensor_memory {

// Idempotent; thread-safe. Counting starts at the call (again after uninstall()).
void install();
// Puts libtorch's default allocator back: storages allocated from then on are
// not counted (those counted still are, until freed). The training loop counts
// only its first steps: measured on the demo's model (one rank, 2-core Intel
// Xeon), steps ran about 10% slower while every allocation went through the
// counting allocator.
void uninstall();
bool installed();

int64_t current_bytes();  // storage live now
int64_t peak_bytes();     // the most live at once since install() or the last reset_peak()
void reset_peak();        // peak := current

}  // namespace meshtrain::tensor_memory
