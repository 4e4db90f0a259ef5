// TiledLogitsLoss: the LM head + summed cross-entropy over tiles of the sequence, with
// each tile's backward computed inside the forward pass, so that the full [bs, T, V] logits never
// exist: one tile's [bs*T_i, V] logits at a time. Same result as model::lm_loss_sum.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>

#include "config/options.h"
#include "model/lm_loss.h"

namespace ulysses::sp {

// memory.tiled_loss auto aims at this many bytes of fp32 logits per tile.
inline constexpr int64_t kAutoLossTileBytes = int64_t{1} << 30;  // 1 GiB

// Equal to model::lm_loss_sum(hidden, lm_head_weight, labels) up to fp rounding: sum is the
// cross-entropy summed over labels != -100 (0 when there are none), in fp32 (fp64 for fp64
// operands), and count the number of those labels. Tiles are sequence_tiles(T, tiles) of dim 1.
//   hidden [bs, T, h], lm_head_weight [V, h], labels [bs, T] int64 (-100 or in [0, V))
// Forward computes per tile the logits [bs*T_i, V] (GEMM in the model's dtype, result in fp32
// for the softmax), the loss, and the gradients of the loss sum w.r.t. the hidden tile and the
// weight (as if the incoming gradient were 1), with GEMMs in the model's dtype; the logit
// gradient is the softmax, written once and corrected in place, and is freed with the tile, so
// backward recomputes nothing. It keeps grad_hidden [bs, T, h] in the model's dtype (bf16 for a
// bf16 model) and grad_weight [V, h], summed over the tiles by the GEMMs (sp/wide_matmul.h), in
// fp32 (for a bf16 model twice the bytes of the weight; never a bf16 running sum), and backward
// returns them times the actual incoming gradient, in the hidden's and the weight's dtype.
// Working memory per tile: the fp32 logits and their softmax ([bs*T_i, V] each, the logits freed
// once the softmax exists), plus a bf16 copy of the softmax for a bf16 model. Gradients are
// computed only when grad mode is on and hidden / the weight require grad. A tied weight (the
// embedding's) receives this gradient on top of the embedding's, through the graph. No device
// sync.
// REQUIRES: tiles >= 1, T >= 1; shapes as above (TORCH_CHECK).
model::LossSum tiled_lm_loss_sum(const at::Tensor& hidden, const at::Tensor& lm_head_weight,
                                 const at::Tensor& labels, int64_t tiles);

// memory.tiled_loss auto: tiles whose fp32 logits [bs * T_i, V] are about kAutoLossTileBytes
// each: ceil(bs * T * V * 4 / 1 GiB), clamped to [1, T] (tiles are cut as in sequence_tiles, so a
// tile may exceed 1 GiB by at most bs * V * 4 bytes). E.g. bs 1, T 32768, V 128256 -> 16
// tiles of 2048 positions (0.98 GiB of logits each); bs 1, T 4096, V 32000 -> 1.
// REQUIRES: batch, local_seq_len, vocab_size >= 1.
int64_t auto_loss_tiles(int64_t batch, int64_t local_seq_len, int64_t vocab_size);

// memory.tiled_loss resolved for one micro-batch: `count` itself when it is a number, else
// auto_loss_tiles(batch, local_seq_len, vocab_size). Local: no collective (the loss has none).
int64_t resolve_loss_tiles(const config::TileCount& count, int64_t batch, int64_t local_seq_len,
                           int64_t vocab_size);

}  // namespace ulysses::sp
