// RMSNorm (see rms_norm.h): the module; the op with its ATen path and fused kernels is
// kernels/rms_norm.h.
#include "model/rms_norm.h"

#include "kernels/rms_norm.h"
#include "model/plain_layers.h"

namespace ulysses::model {

RMSNormImpl::RMSNormImpl(int64_t hidden_size, double eps_value, bool fused)
    : eps(eps_value), fused_kernels(fused) {
  TORCH_CHECK(hidden_size > 0 && eps_value > 0, "RMSNorm: hidden_size and eps must be positive");
  at::Tensor ones = new_parameter({hidden_size});
  if (!ShapesOnlyScope::active()) ones.fill_(1.0);
  weight = register_parameter("weight", ones);
}

at::Tensor RMSNormImpl::forward(const at::Tensor& x) {
  return kernels::rms_norm(x, weight, eps, fused_kernels);
}

}  // namespace ulysses::model
