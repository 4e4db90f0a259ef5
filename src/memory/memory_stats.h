// Memory accounting per rank: peak host memory (RSS high-water mark) and, on CUDA builds, peak
// device memory from the caching allocator.
#pragma once
#include <c10/core/Device.h>

#include <cstdint>
#include <optional>

namespace ulysses::memory {

// Peak resident set size of this process so far, in bytes (getrusage ru_maxrss). Not what
// memory.limit_gib caps on a CPU (address space, see peak_address_space_above_baseline): memory
// the process reserved before its baseline (thread stacks, malloc arenas) becomes resident
// without growing its address space.
int64_t peak_host_bytes();

// The rank's start-up baseline: what its stored peak (StepMetrics::peak_mem_bytes) counts from.
// On a CPU device the resident-set high-water mark now (peak_host_bytes(): LibTorch, the
// process groups and their threads, the OpenMP pool), on a CUDA device 0 (the device footprint
// counts from zero). On a CPU device it also records the virtual size now, the start-up address
// space that peak_address_space_above_baseline counts from. Call it once, after the process groups
// exist and before the model is built (apply_memory_limit does); a later call replaces the values.
void record_startup_baseline(const c10::Device& device);
// The value record_startup_baseline stored, in bytes; nullopt when it was never called (a rank
// built in a test without ulysses-train's start-up).
std::optional<int64_t> startup_baseline_bytes();

// Current virtual address-space size of this process (VmSize of /proc/self/status), in bytes:
// what RLIMIT_AS caps. 0 when /proc is unreadable.
int64_t virtual_memory_bytes();

// The rank's peak address space above its start-up address space, in bytes: what memory.limit_gib
// caps on a CPU device (memory_limit.h; the limit's baseline is the same moment's virtual size).
// The high-water mark is VmPeak of /proc/self/status, which counts from the start of the process,
// so a mapping made and released before the baseline counts too; while an RLIMIT_AS is set no
// later mapping can pass it, so the peak is taken at most up to that cap. nullopt on a CUDA
// device, before record_startup_baseline, or when /proc is unreadable.
std::optional<int64_t> peak_address_space_above_baseline();

// Starts a new window for DeviceMemory's peaks on a CUDA `device` (nothing otherwise).
void reset_peak_device_bytes(const c10::Device& device);

// Device memory of this rank on a CUDA `device` (all zero for CPU devices or CPU-only builds).
// The footprint is what a device of limit_gib must hold: the allocator's reserved peak (what
// memory.limit_gib caps; reserved - allocated is cached or fragmented) plus the memory outside
// the allocator (CUDA context, NCCL buffers, cuBLAS workspaces) as the driver reports it.
struct DeviceMemory {
  int64_t peak_allocated = 0;     // caching allocator, since reset_peak_device_bytes()
  int64_t peak_reserved = 0;      // its segments, same window
  int64_t outside_allocator = 0;  // now: device memory in use minus the allocator's reserved
                                  // (every process on the device counts)
  int64_t footprint() const { return peak_reserved + outside_allocator; }
};
DeviceMemory device_memory(const c10::Device& device);

}  // namespace ulysses::memory
