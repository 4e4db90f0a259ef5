// Tile-by-tile forward without activations, tile-by-tile recompute in backward
// (see sequence_tiled_compute.h). The autograd node is hand-written because it owns a closure.
#include "sp/sequence_tiled_compute.h"

#include "common/torch_compat.h"
#include "sp/contribution_window.h"

#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>

#include <algorithm>

namespace ulysses::sp {
namespace {

using torch::autograd::SavedVariable;
using torch::autograd::variable_list;

// The part of the output gradient that tile `tile` produced.
at::Tensor tile_output_grad(const at::Tensor& grad_out, const SequenceTile& tile,
                            int64_t total_length, TileReduction reduction) {
  switch (reduction) {
    case TileReduction::kNone:
      return grad_out.narrow(1, tile.start, tile.length);  // [bs, T_i, ...]
    case TileReduction::kSum:
      return grad_out;
    case TileReduction::kMean:
      return grad_out * (static_cast<double>(tile.length) / static_cast<double>(total_length));
  }
  TORCH_CHECK(false, "sequence_tiled_compute: unknown reduction");
}

// A leaf copy of `t` (sharing its memory) whose .grad collects the gradient fn's backward gives it.
at::Tensor gradient_leaf(const at::Tensor& t, bool wants_grad) {
  at::Tensor leaf = t.detach();
  if (wants_grad) leaf.requires_grad_(true);
  return leaf;
}

// Backward of sequence_tiled_compute. Inputs of the node: the output's gradient. Outputs: one
// gradient per sharded input, then one per passthrough input (undefined where none is due).
struct SequenceTiledComputeBackward : public torch::autograd::Node {
  TiledFn fn;
  std::vector<SavedVariable> sharded;      // [bs, T, ...] each
  std::vector<SavedVariable> passthrough;  // any shape
  std::vector<SequenceTile> tiles;
  int64_t total_length = 0;  // T
  bool grad_input = true;
  TileReduction reduction = TileReduction::kNone;

  std::string name() const override { return "SequenceTiledComputeBackward"; }

  void release_variables() override {
    for (auto& v : sharded) v.reset_data();
    for (auto& v : passthrough) v.reset_data();
    fn = nullptr;  // drops what the closure holds (modules)
  }

  variable_list apply(variable_list&& grads) override {
    TORCH_CHECK(fn, "sequence_tiled_compute: backward ran twice; use retain_graph to allow it");
    variable_list result(sharded.size() + passthrough.size());  // undefined = no gradient
    const at::Tensor& grad_out = grads[0];                      // shape of the forward output
    if (!grad_out.defined()) return result;

    std::vector<at::Tensor> inputs, pass_leaves;
    for (const auto& v : sharded) inputs.push_back(v.unpack());
    for (const auto& v : passthrough) {
      at::Tensor p = v.unpack();
      pass_leaves.push_back(gradient_leaf(p, grad_input && p.requires_grad()));
    }
    std::vector<at::Tensor> input_grads(inputs.size());  // [bs, T, ...] each, filled per tile

    at::AutoGradMode enable_grad(true);
    // Every tile adds a contribution to fn's weights; a consumer may sum them where they are and
    // move the sum once, when the last tile is done.
    ContributionWindow tiles_contribute_together;
    for (const SequenceTile& tile : tiles) {
      std::vector<at::Tensor> shard_leaves;  // [bs, T_i, ...] each
      for (const auto& x : inputs) {
        shard_leaves.push_back(
            gradient_leaf(x.narrow(1, tile.start, tile.length), grad_input && x.requires_grad()));
      }
      at::Tensor out = fn(shard_leaves, pass_leaves);
      if (!out.requires_grad()) continue;  // nothing in this tile needs a gradient
      torch::autograd::backward({out}, {tile_output_grad(grad_out, tile, total_length, reduction)});
      for (size_t k = 0; k < inputs.size(); ++k) {
        const at::Tensor& g = shard_leaves[k].grad();  // [bs, T_i, ...]
        if (!g.defined()) continue;
        if (!input_grads[k].defined()) input_grads[k] = at::zeros_like(inputs[k]);
        input_grads[k].narrow(1, tile.start, tile.length).copy_(g);
      }
    }
    for (size_t k = 0; k < inputs.size(); ++k) result[k] = input_grads[k];
    for (size_t k = 0; k < pass_leaves.size(); ++k) {
      result[inputs.size() + k] = pass_leaves[k].grad();  // summed over tiles
    }
    return result;
  }
};

// Adds tile i's output to the running result of the forward pass.
void accumulate(at::Tensor& result, const at::Tensor& out, const SequenceTile& tile,
                int64_t total_length, TileReduction reduction) {
  if (reduction == TileReduction::kNone) {
    TORCH_CHECK(out.dim() >= 2 && out.size(1) == tile.length,
                "sequence_tiled_compute: with reduction none fn must return [bs, T_i, ...], got ",
                out.sizes(), " for a tile of ", tile.length, " positions");
    if (!result.defined()) {
      std::vector<int64_t> sizes = out.sizes().vec();
      sizes[1] = total_length;
      result = at::empty(sizes, out.options());  // [bs, T, ...]
    }
    TORCH_CHECK(out.dim() == result.dim() && out.size(0) == result.size(0) &&
                    out.sizes().slice(2) == result.sizes().slice(2),
                "sequence_tiled_compute: tile output ", out.sizes(), " does not match ",
                result.sizes());
    result.narrow(1, tile.start, tile.length).copy_(out);
    return;
  }
  const double weight = reduction == TileReduction::kMean
                            ? static_cast<double>(tile.length) / static_cast<double>(total_length)
                            : 1.0;
  if (!result.defined()) {
    result = at::zeros_like(out, at::MemoryFormat::Contiguous);  // owned: fn may return a view
  }
  TORCH_CHECK(out.sizes() == result.sizes(), "sequence_tiled_compute: tile output ", out.sizes(),
              " differs from the first tile's ", result.sizes());
  result.add_(out, weight);
}

}  // namespace

std::vector<SequenceTile> sequence_tiles(int64_t length, int64_t tiles) {
  TORCH_CHECK(length >= 1 && tiles >= 1, "sequence_tiles: length ", length, ", tiles ", tiles);
  const int64_t tile_length = (length + tiles - 1) / tiles;
  std::vector<SequenceTile> out;
  for (int64_t start = 0; start < length; start += tile_length) {
    out.push_back({start, std::min(tile_length, length - start)});
  }
  return out;
}

at::Tensor sequence_tiled_compute(const TiledFn& fn, int64_t shards,
                                  const std::vector<at::Tensor>& inputs_to_shard,
                                  const std::vector<at::Tensor>& passthrough, bool grad_input,
                                  TileReduction reduction) {
  TORCH_CHECK(fn, "sequence_tiled_compute: empty fn");
  TORCH_CHECK(shards >= 1, "sequence_tiled_compute: shards must be >= 1, got ", shards);
  TORCH_CHECK(!inputs_to_shard.empty(), "sequence_tiled_compute: no input to shard");
  const at::Tensor& first = inputs_to_shard[0];
  const int64_t total_length = first.defined() && first.dim() >= 2 ? first.size(1) : 0;  // T
  for (const auto& x : inputs_to_shard) {
    TORCH_CHECK(
        x.defined() && x.dim() >= 2 && x.size(1) == total_length && total_length >= 1,
        "sequence_tiled_compute: inputs to shard must be [bs, T, ...] with one T >= 1, got ",
        x.sizes());
  }
  const std::vector<SequenceTile> tiles = sequence_tiles(total_length, shards);

  at::Tensor result;
  {
    at::NoGradGuard no_grad;  // keeps no activations
    for (const SequenceTile& tile : tiles) {
      std::vector<at::Tensor> shard_views;  // [bs, T_i, ...] each
      for (const auto& x : inputs_to_shard) {
        shard_views.push_back(x.narrow(1, tile.start, tile.length));
      }
      accumulate(result, fn(shard_views, passthrough), tile, total_length, reduction);
    }
  }
  if (!at::GradMode::is_enabled()) return result;

  TORCH_CHECK(at::isFloatingType(result.scalar_type()),
              "sequence_tiled_compute: fn must return a floating-point tensor, got ",
              result.scalar_type());
  auto node = compat::make_autograd_node<SequenceTiledComputeBackward>();
  node->fn = fn;
  for (const auto& x : inputs_to_shard) node->sharded.emplace_back(x, /*is_output=*/false);
  for (const auto& p : passthrough) node->passthrough.emplace_back(p, /*is_output=*/false);
  node->tiles = tiles;
  node->total_length = total_length;
  node->grad_input = grad_input;
  node->reduction = reduction;
  node->set_next_edges(torch::autograd::collect_next_edges(inputs_to_shard, passthrough));
  torch::autograd::set_history(result, node);
  return result;
}

}  // namespace ulysses::sp
