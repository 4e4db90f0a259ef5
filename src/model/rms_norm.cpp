// RMSNorm (see rms_norm.h).
#include "model/rms_norm.h"

namespace ulysses::model {

RMSNormImpl::RMSNormImpl(int64_t hidden_size, double eps_value) : eps(eps_value) {
  TORCH_CHECK(hidden_size > 0 && eps_value > 0, "RMSNorm: hidden_size and eps must be positive");
  weight = register_parameter("weight", torch::ones({hidden_size}));
}

at::Tensor RMSNormImpl::forward(const at::Tensor& x) {
  const at::ScalarType in_dtype = x.scalar_type();
  const bool half = in_dtype == at::kHalf || in_dtype == at::kBFloat16;
  at::Tensor xc = half ? x.to(at::kFloat) : x;                                 // [..., h]
  at::Tensor inv_rms = at::rsqrt(xc.pow(2).mean(-1, /*keepdim=*/true) + eps);  // [..., 1]
  // As HF: normalize in the compute dtype, cast back, then scale by the weight.
  return weight * (xc * inv_rms).to(in_dtype);
}

}  // namespace ulysses::model
