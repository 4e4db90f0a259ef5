// Global L2 norm of all gradients, and scaling them down to max_norm; see grad_clip.h.
#include "optim/grad_clip.h"

#include <c10/util/Exception.h>

#include <cmath>
#include <optional>

namespace ulysses::train {

double clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm) {
  std::vector<at::Tensor> grads;
  for (const at::Tensor& param : params) grads.push_back(param.grad());
  return clip_gradients(grads, max_norm);
}

double gradient_norm(const std::vector<at::Tensor>& gradients) {
  at::NoGradGuard no_grad;
  // Per-tensor norms accumulated in fp32 (fp64 for fp64 gradients), by one multi-tensor call per
  // accumulation dtype (on CUDA a few launches for all parameters, not one per parameter); their
  // L2 norm in fp64, read with one host sync.
  std::vector<at::Tensor> by_dtype[2];  // [0]: accumulated in fp32, [1]: in fp64
  for (const at::Tensor& grad : gradients) {
    if (!grad.defined()) continue;
    TORCH_CHECK(grad.layout() == at::kStrided, "clip_grad_norm: sparse gradients unsupported");
    by_dtype[grad.scalar_type() == at::kDouble ? 1 : 0].push_back(grad);
  }
  std::vector<at::Tensor> norms;  // [n] fp64 per accumulation dtype
  for (int d = 0; d < 2; ++d) {
    if (by_dtype[d].empty()) continue;
    norms.push_back(
        at::stack(at::_foreach_norm(by_dtype[d], 2, d == 1 ? at::kDouble : at::kFloat))
            .to(at::kDouble));
  }
  if (norms.empty()) return 0.0;
  return at::cat(norms).norm(2).item<double>();
}

double clip_coefficient(double norm, double max_norm) {
  if (max_norm <= 0.0 || !std::isfinite(norm)) return 1.0;
  const double coef = max_norm / (norm + 1e-6);
  return coef < 1.0 ? coef : 1.0;
}

double clip_gradients(const std::vector<at::Tensor>& gradients, double max_norm) {
  const double total_norm = gradient_norm(gradients);
  const double coef = clip_coefficient(total_norm, max_norm);
  if (coef < 1.0) {
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> defined;
    for (const at::Tensor& grad : gradients) {
      if (grad.defined()) defined.push_back(grad);
    }
    at::_foreach_mul_(defined, coef);  // grad.mul_(coef) for each, in a few launches on CUDA
  }
  return total_norm;
}

double clip_gradients_as_torch(const std::vector<at::Tensor>& gradients, double max_norm) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> defined;
  for (const at::Tensor& grad : gradients) {
    if (!grad.defined()) continue;
    TORCH_CHECK(grad.layout() == at::kStrided, "clip_grad_norm: sparse gradients unsupported");
    TORCH_CHECK(defined.empty() || (grad.scalar_type() == defined[0].scalar_type() &&
                                    grad.device() == defined[0].device()),
                "clip_gradients_as_torch: gradients of one dtype on one device, got ",
                grad.scalar_type(), " on ", grad.device(), " beside ", defined[0].scalar_type(),
                " on ", defined[0].device());
    defined.push_back(grad);
  }
  if (defined.empty()) return 0.0;
  const at::Tensor total = at::linalg_vector_norm(at::stack(at::_foreach_norm(defined, 2)), 2);
  const double norm = total.item<double>();
  if (max_norm > 0.0 && std::isfinite(norm)) {
    const at::Tensor coef = at::clamp((total + 1e-6).reciprocal() * max_norm, std::nullopt, 1.0);
    at::_foreach_mul_(defined, coef);
  }
  return norm;
}

}  // namespace ulysses::train
