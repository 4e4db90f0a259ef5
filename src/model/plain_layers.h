// Linear (bias optional) and token Embedding as bare weight holders. Unlike torch::nn's Linear and
// Embedding they draw nothing from the global RNG: weights start uninitialized (host memory not yet
// touched) and init_llama_weights (llama.h) or materialize_weights (materialize.h) gives them their
// values.
#pragma once
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

namespace ulysses::model {

// While one is alive on this thread, the layers' parameters are built as placeholders: they have
// their shapes, but every stride is 0 and they hold one element, so a model of any size takes no
// memory (ZeRO-3's sharded build then gives each rank only its shards). Nothing may read or
// write a placeholder's values.
class ShapesOnlyScope {
 public:
  ShapesOnlyScope() : previous_(active()) { active() = true; }
  ~ShapesOnlyScope() { active() = previous_; }
  ShapesOnlyScope(const ShapesOnlyScope&) = delete;
  ShapesOnlyScope& operator=(const ShapesOnlyScope&) = delete;

  static bool& active() {
    static thread_local bool shapes_only = false;
    return shapes_only;
  }

 private:
  bool previous_;
};

// A parameter of `shape` in fp32 on the host: uninitialized memory not yet touched, or a
// placeholder inside a ShapesOnlyScope.
inline at::Tensor new_parameter(at::IntArrayRef shape) {
  if (ShapesOnlyScope::active()) {
    return at::empty_strided(shape, std::vector<int64_t>(shape.size(), 0));
  }
  return torch::empty(shape);
}

// y = x W^T (+ b). HF names of the parameters: "weight", "bias".
class LinearImpl : public torch::nn::Module {
 public:
  LinearImpl(int64_t in_features, int64_t out_features, bool with_bias = false) {
    weight = register_parameter("weight", new_parameter({out_features, in_features}));
    if (with_bias) bias = register_parameter("bias", new_parameter({out_features}));
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
    weight = register_parameter("weight", new_parameter({vocab_size, hidden_size}));
  }
  // ids [bs, T] int64 in [0, V) -> [bs, T, h]
  at::Tensor forward(const at::Tensor& ids) { return at::embedding(weight, ids); }

  at::Tensor weight;  // [V, h]
};
TORCH_MODULE(Embedding);

}  // namespace ulysses::model
