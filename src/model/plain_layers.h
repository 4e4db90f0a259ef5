// Linear (bias optional) and token Embedding as bare weight holders. Unlike torch::nn's Linear and
// Embedding they draw nothing from the global RNG: weights start uninitialized (host memory not yet
// touched) and init_llama_weights (llama.h) or materialize_weights (materialize.h) gives them their
// values.
#pragma once
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

namespace ulysses::model {

// y = x W^T (+ b). HF names of the parameters: "weight", "bias".
class LinearImpl : public torch::nn::Module {
 public:
  LinearImpl(int64_t in_features, int64_t out_features, bool with_bias = false) {
    weight = register_parameter("weight", torch::empty({out_features, in_features}));
    if (with_bias) bias = register_parameter("bias", torch::empty({out_features}));
  }
  // x [..., in] -> [..., out]
  at::Tensor forward(const at::Tensor& x) { return at::linear(x, weight, bias); }

  at::Tensor weight;  // [out, in]
  at::Tensor bias;    // [out]; undefined without a bias
};
TORCH_MODULE(Linear);

// Row lookup of token ids. HF name of the parameter: "weight".
class EmbeddingImpl : public torch::nn::Module {
 public:
  EmbeddingImpl(int64_t vocab_size, int64_t hidden_size) {
    weight = register_parameter("weight", torch::empty({vocab_size, hidden_size}));
  }
  // ids [bs, T] int64 in [0, V) -> [bs, T, h]
  at::Tensor forward(const at::Tensor& ids) { return at::embedding(weight, ids); }

  at::Tensor weight;  // [V, h]
};
TORCH_MODULE(Embedding);

}  // namespace ulysses::model
