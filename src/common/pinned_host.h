// Host memory that devices copy into and out of without blocking the host.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <string>

namespace ulysses {

// A zeroed, contiguous host tensor of `sizes` and `dtype`. With `pinned` (and a CUDA build on a
// machine with a GPU) its pages are locked with the CUDA driver, so non_blocking copies between it
// and a device run asynchronously; it then takes exactly its own size (rounded up to a page), where
// PyTorch's pinned allocator rounds every block up to a power of two (up to twice the memory).
// Without `pinned`, or when the driver refuses to lock the pages (locked-memory limits), it is
// ordinary pageable memory: copies are still correct, only synchronous.
// Long-lived buffers only (optimizer state, gradient buffers, the activation offloader's blocks,
// which are reused from step to step): locking pages costs time on the order of a millisecond
// per hundred MB. The memory is unlocked and freed with the last tensor that
// shares it; every asynchronous copy into or out of it must be finished by then.
at::Tensor zeros_on_host(at::IntArrayRef sizes, at::ScalarType dtype, bool pinned);

// True when `t` lies in page-locked host memory (either kind).
bool is_page_locked(const at::Tensor& t);

// Bytes that zeros_on_host was asked to page-lock, on a machine with a GPU, and got as pageable
// memory because the driver refused, since the process started (0 without CUDA or a GPU). The
// first refusal prints describe_pageable_fallback's line to stderr, once per process.
int64_t host_bytes_left_pageable();

// The warning for `bytes` left pageable under a locked-memory limit of `limit_bytes` (RLIMIT_MEMLOCK;
// negative: unlimited or unknown), one line naming both sizes and what it costs. Pure.
std::string describe_pageable_fallback(int64_t bytes, int64_t limit_bytes);

}  // namespace ulysses
