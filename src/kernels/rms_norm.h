// RMSNorm as HF LlamaRMSNorm: y = weight * round(x * rsqrt(mean(x^2) + eps)), the statistics
// in fp32 for bf16/fp16 inputs (the input dtype otherwise), rounded to x's dtype. One autograd op,
// rms_norm(), with its two paths side by side: the ATen ops (every device; always on CPU) and
// the fused CUDA kernels (rms_norm_cuda.cu) where they take the tensors.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace ulysses::kernels {

// x [..., h], weight [h] -> [..., h] in x's dtype, differentiable in x and weight. Saves x, the
// weight and 1/rms per row in the compute dtype (4 B per row in fp32), not the normalized x; its
// backward recomputes what it needs and rounds where autograd through the composed ATen ops
// rounds. fused: the CUDA kernels where rms_norm_fusable(x, weight) holds and x is bf16/fp16
// (model.fused_kernels); the ATen path otherwise.
// REQUIRES: eps > 0; weight [h] of x's dtype and device.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, bool fused);

// --- The fused kernels. Each runs on the current CUDA stream of the inputs' device and returns
// before the kernels end (stream order, as ATen ops do). rows = numel / h for x [..., h]. In a
// build without the kernels (fused_kernels_built() false) rms_norm_fusable is false and the
// kernels' entry points throw.

// How the RMSNorm kernels split one row of h elements over a block: each of `threads` threads
// holds `iters` vectors of `vec` elements (16-byte loads where `vec` > 1), in registers.
struct RowPlan {
  int vec = 0;      // elements per load: 16 / element size, or 1 (h not a multiple, unaligned)
  int threads = 0;  // a multiple of 32, at most 512
  int iters = 0;    // 1, 2, 4 or 8; 0 = h is too wide for the kernels
  bool supported() const { return iters > 0; }
};

// The plan for rows of h elements of `element_size` bytes; `aligned`: every row starts on a
// 16-byte boundary when h is a multiple of the vector width (the tensors' data pointers are).
// REQUIRES: h >= 1, element_size in {2, 4}.
RowPlan rms_norm_row_plan(int64_t h, int64_t element_size, bool aligned);

// The plan for x [..., h] and weight [h] as they lie in memory (the alignment of both).
// REQUIRES: x and weight of one dtype, bf16, fp16 or fp32; weight.size(0) == x.size(-1).
RowPlan rms_norm_plan(const at::Tensor& x, const at::Tensor& weight);

// True when rms_norm_forward/backward take x [..., h] and weight [h]: this build has the kernels,
// both on one CUDA device, one dtype (bf16, fp16 or fp32), contiguous, a supported row plan.
bool rms_norm_fusable(const at::Tensor& x, const at::Tensor& weight);

struct RmsNormOutput {
  at::Tensor y;        // [..., h], x's dtype
  at::Tensor inv_rms;  // [rows] fp32: 1 / sqrt(mean(x^2) + eps), all backward needs besides x, w
};

// REQUIRES: rms_norm_fusable(x, weight), eps > 0.
RmsNormOutput rms_norm_forward(const at::Tensor& x, const at::Tensor& weight, double eps);

struct RmsNormGrads {
  at::Tensor grad_x;       // [..., h] x's dtype; undefined unless asked for
  at::Tensor grad_weight;  // [h] weight's dtype; undefined unless asked for
};

// From forward's x, weight and inv_rms and grad_y [..., h] (x's dtype, contiguous):
//   g = round(grad_y * weight) (as autograd through the ATen ops rounds it),
//   grad_x = round(inv_rms * g - x * inv_rms^3 * mean(g * x)),
//   grad_weight = round(sum over rows of grad_y * round(x * inv_rms)), summed in fp32 per block
//   and the block sums added in a second kernel in a fixed order (deterministic; the products are
//   not rounded to x's dtype before the sum, where the ATen path rounds each).
// REQUIRES: rms_norm_fusable(x, weight); grad_y of x's shape and dtype, contiguous.
RmsNormGrads rms_norm_backward(const at::Tensor& grad_y, const at::Tensor& x,
                               const at::Tensor& weight, const at::Tensor& inv_rms,
                               bool need_grad_x, bool need_grad_weight);

}  // namespace ulysses::kernels
