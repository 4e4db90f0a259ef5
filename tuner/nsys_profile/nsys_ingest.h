// Reads an Nsight Systems SQLite export (`nsys export --type sqlite`) and splits GPU kernel time
// into communication (NCCL kernels) and compute (all other kernels), with their overlap
//. Used by `ulysses-tune profile`; a pure function of the file.
//
// Tables read: CUPTI_ACTIVITY_KIND_KERNEL (start, end, deviceId, shortName, demangledName; ns),
// StringIds (id, value), and, when present, NVTX_EVENTS (push/pop ranges: eventType 59; domain
// creation: eventType 75; text, or textId into StringIds for registered strings; domainId).
//
// Window: the union of the "step" ranges of domain "ulysses" (one per training step and rank,
// phase_timer.h), after dropping each thread's first `skip_steps` (warmup); without step ranges,
// each device's first-kernel-start to last-kernel-end. Kernel intervals are clipped to it.
// Per device: comm = |union of NCCL kernels|, compute = |union of other kernels|, overlap =
// |comm union ∩ compute union|, exposed comm = comm - overlap, kernel = |union of all kernels|.
// A kernel is NCCL when its short or demangled name starts with "nccl" (any case).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace ulysses::nsys_profile {

struct IngestOptions {
  int64_t skip_steps = 0;          // warmup steps to drop per thread
  std::string domain = "ulysses";  // NVTX domain of the step ranges
  std::string step_range = "step";
};

// Times in ms.
struct DeviceSplit {
  int64_t device = 0;
  double window_ms = 0.0;
  double kernel_ms = 0.0;
  double comm_ms = 0.0;
  double compute_ms = 0.0;
  double overlap_ms = 0.0;
  int64_t comm_kernels = 0;  // kernels overlapping the window
  int64_t compute_kernels = 0;
  double exposed_comm_ms() const { return comm_ms - overlap_ms; }
};

struct KernelSplit {
  std::vector<DeviceSplit> devices;  // by device id; devices without kernels in the window omitted
  int64_t steps = 0;                 // step ranges used (all threads)
  DeviceSplit total;                 // sums over devices (device = -1)
};

// Throws UserError("<path>: ...") when the file is missing, not an SQLite database, or lacks
// CUPTI_ACTIVITY_KIND_KERNEL / StringIds (e.g. a profile taken without `-t cuda` or in which no
// kernel ran).
KernelSplit ingest_nsys_sqlite(const std::string& path, const IngestOptions& options = {});

// One line per device plus a total line, e.g.
//   "device 0: window 812.4 ms, kernels 700.1 ms, comm 120.3 ms (overlapped 20.1 ms, exposed
//    100.2 ms), compute 600.0 ms".
std::string describe(const KernelSplit& split);

}  // namespace ulysses::nsys_profile
