// Whether this build has the fused CUDA kernels (see fused_kernels.h).
#include "kernels/fused_kernels.h"

namespace ulysses::kernels {

bool fused_kernels_built() {
#ifdef ULYSSES_FUSED_KERNELS
  return true;
#else
  return false;
#endif
}

}  // namespace ulysses::kernels
