// Model FLOPs of a decoder training step (every family of config/model_family.h), for achieved
// TFLOP/s and MFU, and the hardware peak they are compared with.
//
// FLOPs count 2 per multiply-add; a training step is forward + backward = 3 x forward. Per
// token of a sequence of sl tokens (shape names of common/shapes.h):
//
//   training FLOPs per token = 6 * N_matmul + 6 * L * sl * hq * hd
//   N_matmul = L * (h*hq*hd + 2*h*hkv*hd + hq*hd*h + 3*h*ffn) + V*h
//
// N_matmul counts the weights every token is multiplied by: the q, k, v, o projections, the
// gate/up/down projections of the SwiGLU MLP and the LM head (also when tied to the embedding;
// the embedding lookup itself is a gather). The attention term is causal QK^T and PV: 2*hd
// FLOPs per (query, key) pair and head for each of the two, sl^2/2 pairs per sequence, so
// 2 * sl^2 * hq * hd per layer and sequence forward, x3 for training, / sl per token.
// hq * hd is the attention width whether or not it equals h (Qwen3 and Mistral-Nemo set head_dim
// explicitly). Not counted: norms (Qwen3's per-head q/k norms too), RoPE, SwiGLU gating, softmax,
// the loss's elementwise work, and Qwen2's q/k/v bias adds ((hq + 2*hkv) * hd adds per token and
// layer, about 1e-5 of the layer's matmul FLOPs for Qwen2.5-7B; MFU conventions, and
// transformers-side counters such as ArcticTraining's, count matmuls only); recomputation
// (activation checkpointing, tiled backward) -- so MFU is model FLOPs utilization, not
// hardware FLOPs; and the work saved by document masks when packing.
#pragma once
#include <cstdint>

#include "config/options.h"

namespace ulysses::profile {

struct TrainingFlops {
  double matmul_params = 0.0;        // N_matmul
  double matmul_per_token = 0.0;     // 6 * N_matmul
  double attention_per_token = 0.0;  // 6 * L * sl * hq * hd
  double per_token() const { return matmul_per_token + attention_per_token; }
};

// The formula above for `model` (head_dim 0 = hidden_size / num_heads) at sequence length
// `seq_len` (the padded sl). REQUIRES: positive shapes, seq_len >= 1 (TORCH_CHECK).
TrainingFlops training_flops(const config::ModelOptions& model, int64_t seq_len);

// Forward FLOPs of causal attention over one sequence for `heads` heads: 2 * sl^2 * heads * hd
// (QK^T and PV on the causal half). Training (forward + backward) is 3x this.
double causal_attention_forward_flops(int64_t seq_len, int64_t heads, int64_t head_dim);

// The environment variable carrying the peak FLOP/s of one device (one rank) for the run's
// precision, in TFLOP/s, when profile.peak_tflops is not set (sweep trials set that key from the
// hardware profile, profiles/hardware/).
inline constexpr const char* kPeakTflopsVariable = "ULYSSES_PEAK_TFLOPS";

// Peak FLOP/s per rank from $ULYSSES_PEAK_TFLOPS, or 0 when it is unset or empty (MFU unknown).
// Throws UserError("ULYSSES_PEAK_TFLOPS: ...") when it is set but not a positive number.
double peak_flops_per_rank_from_env();

}  // namespace ulysses::profile
