// The build description (see build_info.h). Compiled without the precompiled LibTorch header so
// that its per-file definitions (version, NVTX) cannot disturb it; only torch/version.h is read.
#include "common/build_info.h"

#include <torch/version.h>

namespace ulysses {
namespace {

const char* yes_no(bool b) { return b ? "yes" : "no"; }

}  // namespace

std::string build_info(const std::string& program) {
#if defined(USE_C10D_GLOO)
  constexpr bool gloo = true;
#else
  constexpr bool gloo = false;
#endif
#if defined(ULYSSES_WITH_CUDA) && defined(USE_C10D_NCCL)
  constexpr bool nccl = true;
#else
  constexpr bool nccl = false;
#endif
#if defined(ULYSSES_WITH_CUDA)
  constexpr bool cuda = true;
#else
  constexpr bool cuda = false;
#endif
#if defined(ULYSSES_BUILD_NVTX)
  constexpr bool nvtx = true;
#else
  constexpr bool nvtx = false;
#endif
  std::string out = program + " " + ULYSSES_VERSION + "\n";
  out += std::string("LibTorch ") + TORCH_VERSION + "\n";
  out += std::string("backends: gloo ") + yes_no(gloo) + ", nccl " + yes_no(nccl) + ", cuda " +
         yes_no(cuda) + ", nvtx " + yes_no(nvtx) + "\n";
#if defined(__clang__)
  out += "compiler: clang " __VERSION__ "\n";
#elif defined(__GNUC__)
  out += "compiler: GCC " __VERSION__ "\n";
#endif
  return out;
}

}  // namespace ulysses
