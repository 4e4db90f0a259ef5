// Rotary position embedding in HF's half-split (`rotate_half`) convention, with the RoPE scaling
// types of transformers' modeling_rope_utils.py computed as it computes them (fp32 tensors where it
// uses tensors, double where it uses Python floats, in its order of operations): linear, dynamic
// (NTK), yarn and llama3. Positions are GLOBAL token positions, so an SP shard rotates its tokens
// exactly as the unsharded sequence would.
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
  // Frequencies from options.rope_theta and the head dim (head_dim 0 means hidden_size /
  // num_heads), scaled by options.rope_scaling_type:
  //   ""      none;
  //   linear  inv_freq / rope_scaling_factor (HF `_compute_linear_scaling_rope_parameters`);
  //   dynamic HF `_compute_dynamic_ntk_parameters` at seq_len = max_position_embeddings, which is
  //           what transformers uses until a forward sees a position >= max_position_embeddings
  //           (validation refuses longer sequences: see README);
  //   yarn    HF `_compute_yarn_parameters`: rope_scaling_factor, rope_original_max_position,
  //           rope_beta_fast/slow, rope_truncate, and the attention factor (rope_attention_factor,
  //           or when 0 from the factor and rope_mscale/rope_mscale_all_dim) that scales cos/sin;
  //   llama3  HF `_compute_llama3_parameters`: rope_scaling_factor, rope_low_freq_factor,
  //           rope_high_freq_factor, rope_original_max_position.
  // Throws UserError("model.rope_scaling_type: ...") for an unknown scaling type, and
  // UserError("model.<field>: ...") for an unusable head_dim or scaling parameter.
  explicit RotaryEmbedding(const config::ModelOptions& options);

  // inv_freq[i] = rope_theta^(-2i/hd), then scaled; fp32 as HF computes it.
  const at::Tensor& inv_freq() const { return inv_freq_; }  // [hd/2] fp32, CPU

  // The factor cos and sin are multiplied by (HF's `attention_scaling`): yarn's attention factor,
  // 1 for every other type.
  double attention_scaling() const { return attention_scaling_; }

  // cos/sin of position * inv_freq, duplicated over the two halves, times attention_scaling(), in
  // fp32 on position_ids' device. position_ids [bs, T] int64 -> {cos [bs, T, hd], sin [bs, T, hd]}.
  // On a device other than the CPU, the first call copies inv_freq there (a blocking copy) and
  // keeps that copy; later calls on that device copy nothing, so a step does not wait for the
  // device here. Not thread-safe (one forward at a time per model).
  RotaryCosSin forward(const at::Tensor& position_ids) const;

 private:
  at::Tensor inv_freq_;  // [hd/2] fp32, CPU
  mutable at::Tensor device_inv_freq_;  // [hd/2] fp32, inv_freq_ on the last non-CPU device used
  double attention_scaling_ = 1.0;
};

// x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x[..., hd/2:], x[..., :hd/2]).
// x [bs, T, heads, hd], cos/sin [bs, T, hd] (any float dtype; cast to x's) -> [bs, T, heads, hd].
at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

}  // namespace ulysses::model
