// SwiGLU's element-wise part, silu(gate) * up, in fp32 per element and rounded as ATen's
// at::silu(gate) * up rounds (silu's result to the dtype, then the product). One autograd op,
// swiglu(), with its two paths side by side: the ATen ops (every device; always on CPU) and the
// fused CUDA kernels (swiglu_cuda.cu) where they take the tensors.
#pragma once
#include <ATen/core/Tensor.h>

namespace ulysses::kernels {

// True when swiglu(gate, up, fused) runs the fused kernels: fused, gate bf16/fp16 and
// swiglu_fusable(gate, up).
bool swiglu_uses_kernels(bool fused, const at::Tensor& gate, const at::Tensor& up);

// gate, up [..., ffn] -> [..., ffn] in their dtype, differentiable in both. The ATen path is
// at::silu(gate) * up; the fused path (swiglu_uses_kernels) saves gate and up only (the ATen ops
// save silu's output besides) and computes both gradients in one kernel.
at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up, bool fused);

// --- The fused kernels. Each runs on the current CUDA stream of the inputs' device and returns
// before the kernels end. In a build without the kernels (fused_kernels_built() false)
// swiglu_fusable is false and the kernels' entry points throw.

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
