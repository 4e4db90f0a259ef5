// TiledMLP over sequence_tiled_compute (see tiled_mlp.h).
#include "sp/tiled_mlp.h"

#include "sp/sequence_tiled_compute.h"

namespace ulysses::sp {

at::Tensor tiled_mlp(model::LlamaMLPImpl& mlp, const at::Tensor& x, int64_t tiles) {
  TORCH_CHECK(tiles >= 1, "tiled_mlp: tiles must be >= 1, got ", tiles);
  TORCH_CHECK(x.dim() == 3, "tiled_mlp: x must be [bs, T, h], got ", x.sizes());
  // The backward recompute runs after this call returns: hold the module, not a reference.
  auto module = std::static_pointer_cast<model::LlamaMLPImpl>(mlp.shared_from_this());
  TiledFn fn = [module](const std::vector<at::Tensor>& shards, const std::vector<at::Tensor>&) {
    return module->forward(shards[0]);  // [bs, T_i, h] -> [bs, T_i, h]
  };
  return sequence_tiled_compute(fn, tiles, {x}, /*passthrough=*/{}, /*grad_input=*/true,
                                TileReduction::kNone);  // [bs, T, h]
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
