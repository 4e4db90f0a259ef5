// Fused CUDA kernels for RMSNorm and SwiGLU. The ATen computation each replaces stays beside it in
// the model (model/rms_norm.cpp, model/llama_mlp.cpp, sp/tiled_mlp.cpp), which calls these only
// with model.fused_kernels and where the *_fusable predicate holds, and keeps its ATen ops
// otherwise (always on CPU).
//
// Every function runs on the current CUDA stream of the inputs' device and returns before the
// kernels end (stream order, as ATen ops do). Shapes: rows = numel / h for x [..., h].
// In a build without the kernels (no CUDA LibTorch or no nvcc) the functions exist but throw
// (TORCH_CHECK: "this build has no fused CUDA kernels"), and every *_fusable returns false.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace ulysses::kernels {

// True when this build compiled the CUDA kernels.
bool fused_kernels_built();

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

// --- RMSNorm, as HF LlamaRMSNorm: y = weight * (x * rsqrt(mean(x^2) + eps)), the statistics in
// fp32, the normalized x rounded to x's dtype, then the product with the weight rounded to it.

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

// --- SwiGLU: silu(gate) * up, in fp32 per element, rounded as ATen's at::silu(gate) * up rounds
// (silu's result to the dtype, then the product).

// True when swiglu_forward/backward take gate and up: this build has the kernels, one CUDA device,
// one shape, one dtype (bf16, fp16 or fp32), both contiguous.
bool swiglu_fusable(const at::Tensor& gate, const at::Tensor& up);

// gate, up [..., ffn] -> [..., ffn] in their dtype. REQUIRES: swiglu_fusable(gate, up).
at::Tensor swiglu_forward(const at::Tensor& gate, const at::Tensor& up);

struct SwigluGrads {
  at::Tensor grad_gate;  // [..., ffn]
  at::Tensor grad_up;    // [..., ffn]
};

// From grad_out [..., ffn] (the dtype of gate, contiguous) and forward's gate and up, in one
// kernel, rounded as autograd through the ATen ops rounds: grad_up = round(grad_out * silu(gate)
// rounded), grad_gate = round(round(grad_out * up) * sigmoid(gate) * (1 + gate * (1 -
// sigmoid(gate)))). Saves nothing besides gate and up (silu is recomputed).
// REQUIRES: swiglu_fusable(gate, up); grad_out of gate's shape and dtype, contiguous.
SwigluGrads swiglu_backward(const at::Tensor& grad_out, const at::Tensor& gate,
                            const at::Tensor& up);

}  // namespace ulysses::kernels
