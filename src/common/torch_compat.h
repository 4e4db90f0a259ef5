// Every difference between LibTorch 1.13 (Debian, CPU) and LibTorch >= 2.3 (CUDA) lives here.
#pragma once
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/version.h>

#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#define ULYSSES_TORCH2 1
#else
#define ULYSSES_TORCH2 0
#endif

namespace ulysses::compat {

// The class that concrete collective implementations (Gloo, NCCL) derive from:
// c10d::ProcessGroup in 1.13, c10d::Backend in 2.x. Both expose the same collective calls
// (allreduce, alltoall_base, allgather, broadcast, barrier) that comm/ uses.
#if ULYSSES_TORCH2
using CollectiveBackend = c10d::Backend;
#else
using CollectiveBackend = c10d::ProcessGroup;
#endif

// True when this LibTorch was built with CUDA and ULYSSES_WITH_CUDA is set by CMake.
#ifdef ULYSSES_WITH_CUDA
inline constexpr bool kHasCuda = true;
#else
inline constexpr bool kHasCuda = false;
#endif

// True when at::scaled_dot_product_attention exists (LibTorch >= 2.0).
inline constexpr bool kHasSdpa = ULYSSES_TORCH2;

}  // namespace ulysses::compat

namespace ulysses::compat {

// Runtime failures of c10d (store, backend, network) thrown when a collective starts, e.g. NCCL
// communicator setup: c10::DistError in 2.x. LibTorch 1.13 has no distinct type (it throws
// c10::Error, which also means a bad argument), so there this class is never thrown.
#if ULYSSES_TORCH2
using DistError = c10::DistError;
#else
struct DistError : public c10::Error {
  using c10::Error::Error;
};
#endif

}  // namespace ulysses::compat
