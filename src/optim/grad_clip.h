// Global-norm gradient clipping (optim.grad_clip), torch.nn.utils.clip_grad_norm_ semantics.
#pragma once
#include <ATen/ATen.h>

#include <vector>

namespace ulysses::train {

// Returns the global L2 norm of the gradients of `params` before clipping:
//   norm = sqrt(sum over params with a defined grad of ||grad||_2^2)
// Each grad's norm is accumulated in fp64 when the grad is fp64, else in fp32 (bf16/fp16 grads
// too); the per-parameter norms are combined in fp64. Parameters whose grad is undefined are
// skipped; with none left the result is 0.
// Then, when max_norm > 0, the norm is finite and coef = max_norm / (norm + 1e-6) is < 1, every
// grad is multiplied in place by coef. max_norm <= 0 never clips. A non-finite norm (inf or NaN
// grads) is returned as is and no grad is touched: the caller decides whether to skip the step
// (torch would scale every grad by NaN).
// The norm is read back to the host (one device sync), as in LibTorch's clip_grad_norm_.
// REQUIRES: all grads dense and on one device; grads already reduced over DP and SP ranks (the
// same on every rank of a group), so every rank computes the same norm and coefficient.
double clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm);

// The same on gradients given directly (e.g. GradientBuffers::grads(), fp32 accumulation buffers
// of bf16 parameters); undefined entries are skipped. clip_grad_norm(params) calls it with each
// parameter's .grad().
double clip_gradients(const std::vector<at::Tensor>& grads, double max_norm);

// The two halves of clip_gradients, for callers that fold the scaling into a later pass instead of
// writing the gradients (AdamW::step's grad_scale under optimizer offload):
// gradient_norm is clip_gradients' norm without touching a grad; clip_coefficient is the factor it
// would scale them by: max_norm / (norm + 1e-6) when max_norm > 0, norm is finite and that is < 1,
// else exactly 1. clip_gradients(g, m) == scaling g by clip_coefficient(gradient_norm(g), m).
double gradient_norm(const std::vector<at::Tensor>& grads);
double clip_coefficient(double norm, double max_norm);

// clip_gradients with torch.nn.utils.clip_grad_norm_'s own numerics (its foreach path, which
// torch takes on CPU and CUDA), for gradients kept in a reduced dtype (memory.precision
// bf16-states), where clip_gradients' fp32/fp64 arithmetic would round differently:
//   norms = _foreach_norm(grads, 2)              one per gradient, in the gradients' dtype
//   total = linalg_vector_norm(stack(norms), 2)  in that dtype
//   coef  = clamp(reciprocal(total + 1e-6) * max_norm, max = 1)   in that dtype
//   _foreach_mul_(grads, coef)                   every gradient, in place
// (Python's `max_norm / t` is `t.reciprocal() * max_norm`.) Returns total as a double. As
// clip_gradients: max_norm <= 0 never clips, and a non-finite total is returned without touching
// a grad (torch would scale every grad by it). Undefined entries are skipped; none left: 0.
// REQUIRES: the defined grads dense, of one floating dtype, on one device (TORCH_CHECK).
double clip_gradients_as_torch(const std::vector<at::Tensor>& grads, double max_norm);

}  // namespace ulysses::train
