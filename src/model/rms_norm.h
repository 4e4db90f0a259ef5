// RMSNorm as in HF LlamaRMSNorm: y = weight * (x / sqrt(mean(x^2) + eps)), computed in fp32 for
// fp16/bf16 inputs (in the input dtype otherwise) and returned in the input dtype. For backward
// it keeps only x, the weight and 1/rms per token (4 B in fp32). With fused_kernels it runs the
// fused CUDA kernels where they take the tensors, the same numerics (the op: kernels/rms_norm.h).
#pragma once
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

namespace ulysses::model {

class RMSNormImpl : public torch::nn::Module {
 public:
  // REQUIRES: hidden_size > 0, eps > 0. The weight is initialized to ones. fused_kernels: use
  // the fused CUDA kernels where kernels::rms_norm_fusable(x, weight) holds (model.fused_kernels).
  RMSNormImpl(int64_t hidden_size, double eps, bool fused_kernels = false);

  // x [..., h] -> [..., h], dtype of x.
  at::Tensor forward(const at::Tensor& x);

  at::Tensor weight;  // [h]
  double eps;
  bool fused_kernels;
};
TORCH_MODULE(RMSNorm);

}  // namespace ulysses::model
