// Global L2 norm of all gradients, and scaling them down to max_norm; see grad_clip.h.
#include "train/grad_clip.h"

#include <c10/util/Exception.h>

#include <cmath>

namespace ulysses::train {

double clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm) {
  std::vector<at::Tensor> grads;
  for (const at::Tensor& param : params) grads.push_back(param.grad());
  return clip_gradients(grads, max_norm);
}

double clip_gradients(const std::vector<at::Tensor>& gradients, double max_norm) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> grads;
  std::vector<at::Tensor> norms;  // each [] fp64, the L2 norm of one grad
  for (const at::Tensor& grad : gradients) {
    if (!grad.defined()) {
      continue;
    }
    TORCH_CHECK(grad.layout() == at::kStrided, "clip_grad_norm: sparse gradients unsupported");
    const at::ScalarType accumulate = grad.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
    norms.push_back(at::norm(grad, 2, accumulate).to(at::kDouble));
    grads.push_back(grad);
  }
  if (grads.empty()) {
    return 0.0;
  }
  const double total_norm = at::stack(norms).norm(2).item<double>();
  if (max_norm <= 0.0 || !std::isfinite(total_norm)) {
    return total_norm;
  }
  const double coef = max_norm / (total_norm + 1e-6);
  if (coef < 1.0) {
    for (at::Tensor& grad : grads) {
      grad.mul_(coef);
    }
  }
  return total_norm;
}

}  // namespace ulysses::train
