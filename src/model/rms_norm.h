// RMSNorm as in HF LlamaRMSNorm: y = weight * (x / sqrt(mean(x^2) + eps)), computed in fp32 for
// fp16/bf16 inputs (in the input dtype otherwise) and returned in the input dtype. For backward
// it keeps only x, the weight and 1/rms per token (4 B in fp32).
#pragma once
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

namespace ulysses::model {

class RMSNormImpl : public torch::nn::Module {
 public:
  // REQUIRES: hidden_size > 0, eps > 0. The weight is initialized to ones.
  RMSNormImpl(int64_t hidden_size, double eps);

  // x [..., h] -> [..., h], dtype of x.
  at::Tensor forward(const at::Tensor& x);

  at::Tensor weight;  // [h]
  double eps;
};
TORCH_MODULE(RMSNorm);

}  // namespace ulysses::model
