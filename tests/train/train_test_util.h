// Shared helpers for the training-stack tests: small model configs and tolerance checks.
#pragma once
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "config/options.h"

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

// Relative L2 error ||a - b|| / max(||b||, tiny), in double.
inline double relative_error(const at::Tensor& a, const at::Tensor& b) {
  const double diff = (a.to(at::kDouble) - b.to(at::kDouble)).norm().item<double>();
  const double ref = b.to(at::kDouble).norm().item<double>();
  return diff / std::max(ref, 1e-30);
}

}  // namespace ulysses::testing
