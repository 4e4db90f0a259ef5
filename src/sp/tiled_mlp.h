// TiledMLP: each layer's SwiGLU MLP run over sequence tiles through
// sequence_tiled_compute, so its [bs, T, ffn] intermediates exist for one tile at a time in
// forward and in backward. Installed in a model with LlamaForCausalLM::set_mlp_runner.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>

#include "comm/group.h"
#include "config/options.h"
#include "model/llama_decoder_layer.h"

namespace ulysses::sp {

// mlp(x) computed over sequence_tiles(T, tiles) of x's dim 1; equal to mlp.forward(x) up to fp
// rounding. x [bs, T, h] -> [bs, T, h]. In backward x gets its gradient through the graph and the
// MLP weights get theirs accumulated into .grad by the tile recompute (sequence_tiled_compute.h).
// The returned graph keeps `mlp` alive. REQUIRES: tiles >= 1; mlp is owned by a shared_ptr (as
// every module inside a ModuleHolder is); x has T >= 1.
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
