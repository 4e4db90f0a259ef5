// Rotary position embedding in HF's half-split (`rotate_half`) convention, with optional llama3
// frequency scaling (HF `_compute_llama3_parameters`). Positions are GLOBAL token positions, so an
// SP shard rotates its tokens exactly as the unsharded sequence would.
#pragma once
#include <ATen/ATen.h>

#include "config/options.h"

namespace ulysses::model {

struct RotaryCosSin {
  at::Tensor cos;  // [bs, T, hd]
  at::Tensor sin;  // [bs, T, hd]
};

class RotaryEmbedding {
 public:
  // Frequencies from options.rope_theta and, when options.rope_scaling_type == "llama3",
  // rope_scaling_factor, rope_low_freq_factor, rope_high_freq_factor, rope_original_max_position.
  // head_dim 0 means hidden_size / num_heads.
  // Throws UserError("model.rope_scaling_type: ...") for an unknown scaling type, and
  // UserError("model.<field>: ...") for an unusable head_dim or scaling parameter.
  explicit RotaryEmbedding(const config::ModelOptions& options);

  // inv_freq[i] = rope_theta^(-2i/hd) (then llama3-scaled), computed in fp32 as HF does.
  const at::Tensor& inv_freq() const { return inv_freq_; }  // [hd/2] fp32, CPU

  // cos/sin of position * inv_freq, duplicated over the two halves, in fp32 on position_ids'
  // device. position_ids [bs, T] int64 -> {cos [bs, T, hd], sin [bs, T, hd]}.
  RotaryCosSin forward(const at::Tensor& position_ids) const;

 private:
  at::Tensor inv_freq_;  // [hd/2] fp32, CPU
};

// x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x[..., hd/2:], x[..., :hd/2]).
// x [bs, T, heads, hd], cos/sin [bs, T, hd] (any float dtype; cast to x's) -> [bs, T, heads, hd].
at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

}  // namespace ulysses::model
