// Contiguous and zig-zag SP shards of a sample (see sequence_layout.h).
#include "data/sequence_layout.h"

#include <c10/util/Exception.h>

namespace ulysses::data {

at::Tensor shard_positions(int64_t padded_length, int64_t sp, int64_t sp_ring, int64_t sp_rank) {
  const int64_t multiple = sp_ring > 1 ? 2 * sp : sp;
  TORCH_CHECK(sp >= 1 && sp_ring >= 1 && sp % sp_ring == 0 && padded_length % multiple == 0 &&
                  sp_rank >= 0 && sp_rank < sp,
              "shard_positions: P ", padded_length, ", sp ", sp, ", sp_ring ", sp_ring, ", rank ",
              sp_rank);
  const int64_t local = padded_length / sp;
  const auto options = at::TensorOptions().dtype(at::kLong);
  if (sp_ring == 1) return at::arange(sp_rank * local, (sp_rank + 1) * local, options);
  const int64_t a2a = sp / sp_ring, chunk = padded_length / (2 * sp_ring);
  const int64_t block = sp_rank / a2a, piece = sp_rank % a2a;
  // Block j's positions in block order, then this rank's piece of them.
  const at::Tensor block_positions =
      at::cat({at::arange(block * chunk, (block + 1) * chunk, options),
               at::arange((2 * sp_ring - 1 - block) * chunk, (2 * sp_ring - block) * chunk,
                          options)});  // [2C]
  return block_positions.narrow(0, piece * local, local).clone();
}

}  // namespace ulysses::data
