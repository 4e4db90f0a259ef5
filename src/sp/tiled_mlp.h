// TiledMLP: each layer's SwiGLU MLP run over sequence tiles (sequence_tiled_compute's scheme with
// a hand-written tile backward), so its [bs, T, ffn] intermediates exist for one tile at a time in
// forward and in backward. Installed in a model with LlamaForCausalLM::set_mlp_runner.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>

#include "comm/group.h"
#include "config/options.h"
#include "model/llama_decoder_layer.h"

namespace ulysses::sp {

// mlp(x) computed over sequence_tiles(T, tiles) of x's dim 1; equal to mlp.forward(x) up to fp
// rounding. x [bs, T, h] -> [bs, T, h].
// Forward runs each tile under no-grad and keeps only x. Backward recomputes each tile's
// activations once and computes its gradients by hand (no nested autograd): x's gradient tile by
// tile, and each weight's gradient as one sum over the tiles, accumulated by add_matmul_
// (sp/wide_matmul.h): in the weight's dtype, or in fp32 for bf16/fp16 weights with more than one
// tile, handed to autograd once per call (one contribution per weight, not one per tile; autograd
// rounds an fp32 sum to the weight's dtype on its way to .grad). The gradients flow through the
// graph as any op's: torch::autograd::grad() gets them too. The weights are read when backward
// runs (a ZeRO gather before the recompute is seen).
// Inside a model::GraphOnlyForward with grad mode on (a checkpointed layer's recompute) the tiles
// do not run: the result is zeros of x's shape with the graph above, since nobody reads it.
// With model.fused_kernels, silu(gate) * up and its backward run through the fused CUDA kernels
// where they take the tile's tensors (kernels/swiglu.h), as in LlamaMLPImpl::forward.
// REQUIRES: tiles >= 1; the projections have no bias; x has T >= 1 and the weights' dtype.
at::Tensor tiled_mlp(model::LlamaMLPImpl& mlp, const at::Tensor& x, int64_t tiles);

// A runner for LlamaForCausalLM::set_mlp_runner that calls tiled_mlp(mlp, x, tiles).
// REQUIRES: tiles >= 1.
model::MlpRunner tiled_mlp_runner(int64_t tiles);

// memory.tiled_mlp auto for one rank: ceil(local_seq_len / hidden_size), at least 1.
// REQUIRES: local_seq_len >= 1, hidden_size >= 1.
int64_t auto_mlp_tiles(int64_t local_seq_len, int64_t hidden_size);

// memory.tiled_mlp resolved for this run: `count` itself when it is a number; for auto,
// auto_mlp_tiles(local_seq_len, hidden_size) MAX-reduced over `world`, so that every rank runs the
// same number of tiles. For auto this is a collective: every rank of `world` must call it.
int64_t resolve_mlp_tiles(const config::TileCount& count, int64_t local_seq_len,
                          int64_t hidden_size, comm::Group& world);

}  // namespace ulysses::sp
