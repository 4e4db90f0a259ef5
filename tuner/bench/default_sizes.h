// The sizes ulysses-bench measures when no size flag is given: its --help prints these, and
// `ulysses-tune calibrate` runs ulysses-bench without size flags, so both use this one source.
#pragma once
#include <cstdint>

namespace ulysses::bench {

// All-to-all send-buffer bytes per rank (--a2a-bytes).
inline constexpr const char* kCpuA2aBytes = "65536,1048576,4194304";
inline constexpr const char* kCudaA2aBytes = "1048576,16777216,134217728,536870912";
// Attention sequence lengths (--seqlens) on CPU; on CUDA sl/4, sl/2 and sl of the run config.
inline constexpr const char* kCpuSeqlens = "256,512";
// Tokens per GEMM/MLP call (--tokens) on CPU; on CUDA sl/sp of the run config.
inline constexpr int64_t kCpuTokens = 512;
// Host<->device copy bytes (--copy-bytes; CUDA only).
inline constexpr const char* kCopyBytes = "1048576,67108864,268435456";

}  // namespace ulysses::bench
