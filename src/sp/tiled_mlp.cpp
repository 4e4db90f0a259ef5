// TiledMLP: the SwiGLU MLP over sequence tiles with a hand-written per-tile backward (see
// tiled_mlp.h).
#include "sp/tiled_mlp.h"

#include <torch/csrc/autograd/custom_function.h>

#include "kernels/swiglu.h"
#include "model/graph_only_forward.h"
#include "sp/sequence_tiled_compute.h"
#include "sp/wide_matmul.h"

namespace ulysses::sp {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// The MLP's weights, in LlamaMLPImpl's parameter order.
struct MlpWeights {
  at::Tensor gate;  // [ffn, h]
  at::Tensor up;    // [ffn, h]
  at::Tensor down;  // [h, ffn]
};

// LlamaMLPImpl::forward with the same ops, so that a tile's output equals the untiled one's rows.
// x [..., h] -> [..., h]
at::Tensor mlp_rows(const at::Tensor& x, const MlpWeights& w, bool fused) {
  return at::linear(kernels::swiglu(at::linear(x, w.gate), at::linear(x, w.up), fused), w.down);
}

// The gradient sums of the weights over the tiles: [param shape] in the weights' dtype, or fp32
// for bf16/fp16 weights when there is more than one tile; undefined where no gradient is due.
struct WeightGradSums {
  at::Tensor gate, up, down;
};

// tile_backward after gate and up [n, ffn] with the fused kernels: down's input recomputed by
// swiglu_forward, both element-wise gradients by one swiglu_backward.
at::Tensor tile_backward_fused(const at::Tensor& x, const at::Tensor& grad_out,
                               const MlpWeights& w, WeightGradSums& sums, const at::Tensor& gate,
                               const at::Tensor& up) {
  if (sums.down.defined()) {
    add_matmul_(sums.down, grad_out.t(), kernels::swiglu_forward(gate, up));  // [h, ffn]
  }
  kernels::SwigluGrads g = kernels::swiglu_backward(at::mm(grad_out, w.down), gate, up);
  if (sums.up.defined()) add_matmul_(sums.up, g.grad_up.t(), x);  // [ffn, h]
  at::Tensor grad_x = at::mm(g.grad_up, w.up);                     // [n, h]
  g.grad_up.reset();
  if (sums.gate.defined()) add_matmul_(sums.gate, g.grad_gate.t(), x);  // [ffn, h]
  return grad_x.addmm_(g.grad_gate, w.gate);                            // [n, h]
}

// One tile's backward: recomputes the tile's activations and adds its weight gradients to `sums`.
// Returns the tile's input gradient. x, grad_out [n, h] -> [n, h]
at::Tensor tile_backward(const at::Tensor& x, const at::Tensor& grad_out, const MlpWeights& w,
                         WeightGradSums& sums, bool fused) {
  const at::Tensor gate = at::mm(x, w.gate.t());  // [n, ffn]
  const at::Tensor up = at::mm(x, w.up.t());      // [n, ffn]
  if (kernels::swiglu_uses_kernels(fused, gate, up)) {
    return tile_backward_fused(x, grad_out, w, sums, gate, up);
  }
  at::Tensor act = at::silu(gate);                // [n, ffn]
  at::Tensor product = act * up;                  // [n, ffn] down_proj's input
  if (sums.down.defined()) add_matmul_(sums.down, grad_out.t(), product);  // [h, ffn]
  at::Tensor grad_product = at::mm(grad_out, w.down);  // [n, ffn]
  at::Tensor grad_up = at::mul_out(product, grad_product, act);  // [n, ffn], product's memory
  act.reset();
  if (sums.up.defined()) add_matmul_(sums.up, grad_up.t(), x);  // [ffn, h]
  at::Tensor grad_x = at::mm(grad_up, w.up);                     // [n, h]
  grad_up.reset();
  product.reset();
  at::Tensor grad_act = grad_product.mul_(up);                   // [n, ffn]
  const at::Tensor grad_gate = at::silu_backward(grad_act, gate);  // [n, ffn]
  if (sums.gate.defined()) add_matmul_(sums.gate, grad_gate.t(), x);  // [ffn, h]
  return grad_x.addmm_(grad_gate, w.gate);                            // [n, h]
}

struct TiledMlpFunction : public torch::autograd::Function<TiledMlpFunction> {
  // x [bs, T, h] -> [bs, T, h]. compute_output false: zeros of that shape (a graph-only forward,
  // model/graph_only_forward.h), since backward needs only x.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& gate,
                            const at::Tensor& up, const at::Tensor& down, int64_t tiles,
                            bool compute_output, bool fused) {
    const MlpWeights w{gate, up, down};
    at::Tensor out;  // [bs, T, h]
    if (!compute_output) {
      out = at::zeros(x.sizes(), x.options());
    } else {
      out = at::empty(x.sizes(), x.options());
      for (const SequenceTile& tile : sequence_tiles(x.size(1), tiles)) {
        at::Tensor rows = out.narrow(1, tile.start, tile.length);  // [bs, T_i, h]
        rows.copy_(mlp_rows(x.narrow(1, tile.start, tile.length), w, fused));
      }
    }
    ctx->save_for_backward({x});
    // The weights as they are when backward runs (ZeRO gathers them again for a recompute), not
    // as saved variables, whose version check an in-place gather would trip.
    ctx->saved_data["gate"] = gate;
    ctx->saved_data["up"] = up;
    ctx->saved_data["down"] = down;
    ctx->saved_data["tiles"] = tiles;
    ctx->saved_data["fused"] = fused;
    return out;
  }

  // grads[0] [bs, T, h] -> {d x [bs, T, h], d gate, d up, d down (fp32 sums for bf16 weights; the
  // engine converts them to the weights' dtype), none, none, none}.
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    TORCH_CHECK(ctx->saved_data.count("gate") == 1,
                "tiled_mlp: backward can run only once (retain_graph is not supported)");
    const at::Tensor x = ctx->get_saved_variables().at(0);  // [bs, T, h]
    const MlpWeights w{ctx->saved_data["gate"].toTensor(), ctx->saved_data["up"].toTensor(),
                       ctx->saved_data["down"].toTensor()};
    const int64_t tiles = ctx->saved_data["tiles"].toInt();
    const bool fused = ctx->saved_data["fused"].toBool();
    ctx->saved_data.clear();
    const at::Tensor& grad_out = grads[0];  // [bs, T, h]
    tensor_list result(7);
    if (!grad_out.defined()) return result;

    const std::vector<SequenceTile> cuts = sequence_tiles(x.size(1), tiles);
    const at::ScalarType dtype = w.gate.scalar_type();
    const bool half = dtype == at::kBFloat16 || dtype == at::kHalf;
    const at::ScalarType sum_dtype = half && cuts.size() > 1 ? at::kFloat : dtype;
    auto zeros_if = [&](int input, const at::Tensor& weight) {
      return ctx->needs_input_grad(input)
                 ? at::zeros(weight.sizes(), weight.options().dtype(sum_dtype))
                 : at::Tensor();
    };
    WeightGradSums sums{zeros_if(1, w.gate), zeros_if(2, w.up), zeros_if(3, w.down)};
    at::Tensor grad_x;  // [bs, T, h]
    if (ctx->needs_input_grad(0)) grad_x = at::empty(x.sizes(), x.options());
    const int64_t batch = x.size(0), hidden = x.size(2);
    for (const SequenceTile& tile : cuts) {
      const at::Tensor x_tile = x.narrow(1, tile.start, tile.length).reshape({-1, hidden});
      const at::Tensor grad_tile = grad_out.narrow(1, tile.start, tile.length)
                                       .to(x.scalar_type())
                                       .reshape({-1, hidden});  // [bs*T_i, h]
      at::Tensor grad_x_tile = tile_backward(x_tile, grad_tile, w, sums, fused);  // [bs*T_i, h]
      if (grad_x.defined()) {
        grad_x.narrow(1, tile.start, tile.length)
            .copy_(grad_x_tile.view({batch, tile.length, hidden}));
      }
    }
    result[0] = grad_x;
    result[1] = sums.gate;
    result[2] = sums.up;
    result[3] = sums.down;
    return result;
  }
};

}  // namespace

at::Tensor tiled_mlp(model::LlamaMLPImpl& mlp, const at::Tensor& x, int64_t tiles) {
  TORCH_CHECK(tiles >= 1, "tiled_mlp: tiles must be >= 1, got ", tiles);
  TORCH_CHECK(x.dim() == 3 && x.size(1) >= 1, "tiled_mlp: x must be [bs, T, h], got ", x.sizes());
  TORCH_CHECK(!mlp.gate_proj->bias.defined() && !mlp.up_proj->bias.defined() &&
                  !mlp.down_proj->bias.defined(),
              "tiled_mlp: the MLP's projections must have no bias");
  const bool graph_only = at::GradMode::is_enabled() && model::GraphOnlyForward::active();
  return TiledMlpFunction::apply(x, mlp.gate_proj->weight, mlp.up_proj->weight,
                                 mlp.down_proj->weight, tiles, !graph_only,
                                 mlp.fused_kernels);  // [bs, T, h]
}
model::MlpRunner tiled_mlp_runner(int64_t tiles) {
  TORCH_CHECK(tiles >= 1, "tiled_mlp_runner: tiles must be >= 1, got ", tiles);
  return
      [tiles](model::LlamaMLPImpl& mlp, const at::Tensor& x) { return tiled_mlp(mlp, x, tiles); };
}

int64_t auto_mlp_tiles(int64_t local_seq_len, int64_t hidden_size) {
  TORCH_CHECK(local_seq_len >= 1 && hidden_size >= 1, "auto_mlp_tiles: local_seq_len ",
              local_seq_len, ", hidden_size ", hidden_size);
  return std::max<int64_t>(1, (local_seq_len + hidden_size - 1) / hidden_size);
}

int64_t resolve_mlp_tiles(const config::TileCount& count, int64_t local_seq_len,
                          int64_t hidden_size, comm::Group& world) {
  if (!count.is_auto()) return count.value;
  at::Tensor tiles = at::tensor({auto_mlp_tiles(local_seq_len, hidden_size)}, at::kLong);  // [1]
  world.all_reduce(tiles, comm::ReduceOp::kMax);
  return tiles.item<int64_t>();
}

}  // namespace ulysses::sp
