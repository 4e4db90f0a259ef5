// sequence_tiled_compute (ALST's SequenceTiledCompute): runs a function over tiles of
// the sequence dim so that only one tile's activations exist at a time, in forward and backward.
// TiledMLP (tiled_mlp.h) follows the same scheme with a hand-written tile backward.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <vector>

namespace ulysses::sp {

// How the outputs of the tiles form the result. Tile i covers T_i of the T positions.
enum class TileReduction {
  kNone,  // out [bs, T, ...] = tile outputs [bs, T_i, ...] concatenated along dim 1
  kSum,   // out = sum_i out_i (all out_i of one shape)
  // out = sum_i (T_i / T) * out_i: the token-weighted mean. When fn returns a mean over the tokens
  // of its tile, the result is the mean over all T tokens, also for an uneven last tile. (With
  // even tiles it is the plain mean over tiles.)
  kMean,
};

// Positions [start, start + length) of the sequence dim.
struct SequenceTile {
  int64_t start = 0;
  int64_t length = 0;
};

// Cuts `length` positions the way torch.chunk does: tiles of ceil(length / tiles) positions, the
// last one shorter when it does not divide. So ceil(length / ceil(length / tiles)) <= tiles tiles
// result, e.g. length 11, tiles 3 -> 4,4,3; length 11, tiles 7 -> 2,2,2,2,2,1; tiles > length ->
// length tiles of 1. REQUIRES: length >= 1, tiles >= 1.
std::vector<SequenceTile> sequence_tiles(int64_t length, int64_t tiles);

// fn(shards, passthrough): `shards` are the inputs_to_shard cut to one tile ([bs, T_i, ...] each,
// in order), `passthrough` the passthrough tensors whole. Returns one floating-point tensor.
using TiledFn = std::function<at::Tensor(const std::vector<at::Tensor>& shards,
                                         const std::vector<at::Tensor>& passthrough)>;

// Returns the reduction over tiles of fn's outputs (see TileReduction), where the tiles are
// sequence_tiles(T, shards) of dim 1 of every inputs_to_shard tensor ([bs, T, ...]).
//
// Forward runs fn once per tile under no-grad and keeps only the inputs (no activations).
// When grad mode is on, the result carries an autograd node whose backward runs fn again per
// tile with grad enabled and backpropagates that tile's part of the output gradient (its slice
// for kNone, all of it for kSum, (T_i / T) times it for kMean):
//  - tensors fn uses but does not receive (module parameters) get their gradients accumulated
//    into their .grad by a nested torch::autograd::backward, as in PyTorch's reentrant checkpoint.
//    They must be leaves (or made from leaves inside fn), and their gradients go to .grad even when
//    the outer pass is torch::autograd::grad().
//  - with grad_input, every input that requires grad gets its gradient: a sharded input gets
//    [bs, T, ...] assembled from the tiles, a passthrough input the sum over tiles. Without
//    grad_input no input gets a gradient (use it for constants).
// fn must be deterministic (it runs twice) and row-wise in dim 1 for kNone. The result is attached
// to autograd whenever grad mode is on, even if no input requires grad, since fn's parameters may.
//
// REQUIRES: shards >= 1; inputs_to_shard non-empty, each with dim >= 2 and the same size(1) >= 1;
// kNone: fn maps a tile of T_i positions to [bs, T_i, ...] with the other dims equal for all tiles;
// kSum/kMean: every out_i has the same shape. Violations trip TORCH_CHECK. The inputs must not be
// modified in place before backward (checked by version counter).
at::Tensor sequence_tiled_compute(const TiledFn& fn, int64_t shards,
                                  const std::vector<at::Tensor>& inputs_to_shard,  // [bs, T, ...]
                                  const std::vector<at::Tensor>& passthrough = {},
                                  bool grad_input = true,
                                  TileReduction reduction = TileReduction::kNone);

}  // namespace ulysses::sp
