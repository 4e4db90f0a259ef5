// Shared helpers for the training-stack tests: small model configs (Llama and the other decoder
// families), weights that exercise every family term, and tolerance checks.
#pragma once
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "config/options.h"
#include "model/hf_weights.h"
#include "model/llama.h"
#include "model/safetensors.h"

namespace ulysses::testing {

// A tiny Llama config for exactness tests: h 32, 2 layers, hd 8, ffn 48, V 61.
inline config::RunConfig tiny_run_config(int64_t hq, int64_t hkv, int64_t dp, int64_t sp) {
  config::RunConfig c;
  c.model.hidden_size = hq * 8;
  c.model.num_layers = 2;
  c.model.num_heads = hq;
  c.model.num_kv_heads = hkv;
  c.model.head_dim = 8;
  c.model.intermediate_size = 48;
  c.model.vocab_size = 61;
  c.model.init_seed = 7;
  c.model.init_std = 0.2;  // large enough that attention is far from uniform
  c.mesh.dp = dp;
  c.mesh.sp = sp;
  c.sequence.length = 24;
  c.sequence.micro_batch = 1;
  c.sequence.grad_accum = 1;
  c.data.source = "synthetic";
  c.data.seed = 3;
  c.train.steps = 1;
  c.comm.timeout_s = 60;
  c.comm.collective_timeout_s = 60;
  return c;
}

// Makes `model` (tiny_run_config's shapes) one of the decoder families: qwen2 (q/k/v biases) keeps
// hd 8; qwen3 (per-head q/k norms) gets hd 16, so that hq * hd = 2 h (64 != 32 at hq 4) as in
// Qwen3 and Mistral-Nemo, where the projections are not square. llama/mistral: only the name.
inline void set_family(config::ModelOptions& model, const std::string& family) {
  model.family = family;
  if (family == "qwen3") model.head_dim = 16;
}

// Moves every 1-D parameter (q/k/v biases, q/k norms, layer norms) away from its init (0 or 1) by
// seeded noise, N(0, 0.3) added in named_parameters() order: the same on every rank and for every
// model of the same shapes. At init a bias is 0 and a norm weight 1, so a path that dropped one
// would compute the same loss, and a q/k norm applied after RoPE instead of before it would too
// (RoPE rotates pairs of dimensions, which keeps the RMS over hd); after this neither does.
inline void perturb_vector_parameters(torch::nn::Module& model, uint64_t seed = 17) {
  at::NoGradGuard no_grad;
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (auto& item : model.named_parameters()) {
    at::Tensor& p = item.value();
    if (p.dim() != 1) continue;
    p.add_(at::randn(p.sizes(), generator, at::kFloat).mul_(0.3).to(p.options()));
  }
}

// Writes <dir>/model.safetensors: the seeded init of `options` with perturb_vector_parameters
// applied, for whole runs that start from it (model.load = dir; run_training builds its model
// inside, so the tests cannot perturb it afterwards).
inline void write_perturbed_weights(const config::ModelOptions& options, const std::string& dir) {
  config::ModelOptions plain = options;
  plain.load.clear();
  model::LlamaForCausalLM model(plain);
  perturb_vector_parameters(*model);
  model::save_safetensors(dir + "/model.safetensors", model::hf_state(model));
}

// Relative L2 error ||a - b|| / max(||b||, tiny), in double.
inline double relative_error(const at::Tensor& a, const at::Tensor& b) {
  const double diff = (a.to(at::kDouble) - b.to(at::kDouble)).norm().item<double>();
  const double ref = b.to(at::kDouble).norm().item<double>();
  return diff / std::max(ref, 1e-30);
}

}  // namespace ulysses::testing
