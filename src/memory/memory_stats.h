// Memory accounting per rank: peak host memory (RSS high-water mark) and, on CUDA builds, peak
// device memory from the caching allocator.
#pragma once
#include <c10/core/Device.h>

#include <cstdint>

namespace ulysses::memory {

// Peak resident set size of this process so far, in bytes (getrusage ru_maxrss).
int64_t peak_host_bytes();

// Current virtual address-space size of this process (VmSize of /proc/self/status), in bytes:
// what RLIMIT_AS caps. 0 when /proc is unreadable.
int64_t virtual_memory_bytes();

// Peak bytes allocated on `device` since the last reset_peak_device_bytes(); 0 for CPU devices
// or CPU-only builds.
int64_t peak_device_bytes(const c10::Device& device);
void reset_peak_device_bytes(const c10::Device& device);

}  // namespace ulysses::memory
