// Global L2 norm of all gradients, and scaling them down to max_norm; see grad_clip.h.
#include "optim/grad_clip.h"

#include <c10/util/Exception.h>

#include <cmath>

namespace ulysses::train {

double clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm) {
  std::vector<at::Tensor> grads;
  for (const at::Tensor& param : params) grads.push_back(param.grad());
  return clip_gradients(grads, max_norm);
}

double gradient_norm(const std::vector<at::Tensor>& gradients) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> norms;  // each [] fp64, the L2 norm of one grad
  for (const at::Tensor& grad : gradients) {
    if (!grad.defined()) continue;
    TORCH_CHECK(grad.layout() == at::kStrided, "clip_grad_norm: sparse gradients unsupported");
    const at::ScalarType accumulate = grad.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
    norms.push_back(at::norm(grad, 2, accumulate).to(at::kDouble));
  }
  if (norms.empty()) return 0.0;
  return at::stack(norms).norm(2).item<double>();
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
    for (const at::Tensor& grad : gradients) {
      if (grad.defined()) grad.mul_(coef);
    }
  }
  return total_norm;
}

}  // namespace ulysses::train
