// The per-rank memory cap `memory.limit_gib`, which makes out-of-memory behaviour
// testable without a GPU. How the limit is interpreted:
//   CPU device: the process may use limit_gib of address space *beyond what it had reserved when
//     the limit was applied* (its "baseline": libraries, Gloo threads, OpenMP pool and their malloc
//     arenas). The soft RLIMIT_AS becomes baseline + limit. Address space, not RSS, is what the
//     kernel can cap: untouched reservations count, and threads started later count with their
//     stacks and malloc arenas (about 72 MiB each). An allocation past the cap fails; LibTorch
//     reports "can't allocate memory", which ulysses-train maps to exit kExitOutOfMemory.
//   CUDA device: the caching allocator may hold at most limit_gib on the rank's GPU
//     (setMemoryFraction(limit / total)); host memory is not capped (the CUDA driver reserves
//     far more address space than it uses, so RLIMIT_AS cannot be used there).
#pragma once
#include <c10/core/Device.h>

#include <cstdint>
#include <string>

namespace ulysses::memory {

struct MemoryLimit {
  int64_t limit_bytes = 0;     // limit_gib in bytes; 0 = no limit was applied
  int64_t baseline_bytes = 0;  // CPU: virtual size when applied; CUDA: 0
  int64_t cap_bytes = 0;       // CPU: the RLIMIT_AS set; CUDA: the allocator's cap
  bool on_device = false;      // true: CUDA allocator fraction; false: host RLIMIT_AS

  // One line for the log, e.g. "memory limit 2.00 GiB: RLIMIT_AS 2.81 GiB = baseline 0.81 GiB
  // + limit".
  std::string describe() const;
};

// Applies memory.limit_gib for this rank. limit_gib == 0 changes nothing and returns a
// MemoryLimit with limit_bytes 0. Call it once, after the process groups exist and before the
// model is built, so that their threads are part of the baseline. On CPU it first starts the
// intra-op thread pool (each thread allocating once) so that the pool is part of the baseline too.
// With or without a limit it then records the rank's start-up baseline for summary.json
// (memory_stats.h record_startup_baseline).
// Throws UserError("memory.limit_gib: ...") when the limit cannot be applied: negative, above the
// hard RLIMIT_AS, or (CUDA) more than the device has.
MemoryLimit apply_memory_limit(double limit_gib, const c10::Device& device);

// Fixes glibc's mmap threshold at `bytes` for this process, unless the environment sets one
// (MALLOC_MMAP_THRESHOLD_), and returns whether it did. By default glibc raises the threshold each
// time a mapped block is freed (up to 32 MiB); blocks below it then come from the heap, which keeps
// their pages after they are freed. A run that allocates and frees large blocks every step (the
// gathered units and gradient buffers of ZeRO-3 on a CPU) then holds far more resident memory
// than it uses at any moment, and its peak says so. With a fixed threshold those blocks are
// mappings of their own, returned to the system when freed.
bool fix_host_mmap_threshold(int64_t bytes);

}  // namespace ulysses::memory
