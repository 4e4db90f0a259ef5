// Bus and algorithm bandwidth of collectives, defined once as nccl-tests defines them
// (github.com/NVIDIA/nccl-tests, doc/PERFORMANCE.md), so ulysses-bench numbers compare with
// nccl-tests' on the same machine:
//
//   algbw = S / t       S = bytes in one rank's send buffer, t = time of the collective
//                       (the slowest rank's, after a barrier)
//   busbw = algbw * factor, the rate each rank's link sees, comparable with the hardware's
//           link bandwidth:  all-to-all  factor = (n-1)/n   (each rank keeps 1/n of S locally)
//                            all-reduce  factor = 2(n-1)/n  (ring: reduce-scatter + all-gather)
//
// GB here means 1e9 bytes.
#pragma once
#include <cstdint>

namespace ulysses::bench {

// GB/s for `bytes` moved in `seconds`. REQUIRES: seconds > 0.
inline double algbw_gbps(int64_t bytes, double seconds) {
  return static_cast<double>(bytes) / seconds / 1e9;
}

// busbw of an all-to-all over `ranks` ranks. REQUIRES: ranks >= 1.
inline double alltoall_busbw_gbps(double algbw, int64_t ranks) {
  return algbw * static_cast<double>(ranks - 1) / static_cast<double>(ranks);
}

// busbw of an all-reduce over `ranks` ranks. REQUIRES: ranks >= 1.
inline double allreduce_busbw_gbps(double algbw, int64_t ranks) {
  return algbw * 2.0 * static_cast<double>(ranks - 1) / static_cast<double>(ranks);
}

}  // namespace ulysses::bench
