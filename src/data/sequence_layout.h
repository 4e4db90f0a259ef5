// Which positions of a padded sample each rank of an SP group holds.
//   sp_ring 1: rank r holds the contiguous [r P/sp, (r+1) P/sp).
//   sp_ring R > 1 (sp = A x R, zig-zag): the sample is cut into 2R chunks of C = P/(2R); ring
//   block j is chunk j followed by chunk 2R-1-j, so that every ring rank holds as much early as
//   late sequence (equal causal work). SP rank r = j A + a (the A ranks of one all-to-all are
//   contiguous) holds the a-th of A equal contiguous pieces of block j. The all-to-all over those
//   A ranks then assembles block j, in its order, on each of them.
//   sp 4 = A 2 x R 2, P 16: chunks of 4; block 0 = [0,4)+[12,16), block 1 = [4,8)+[8,12);
//   rank 0 holds 0..3, rank 1 12..15, rank 2 4..7, rank 3 8..11.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>

namespace ulysses::data {

// The global positions rank `sp_rank` holds, in the order of its shard: [P/sp] int64 on CPU.
// REQUIRES: sp % sp_ring == 0; P a multiple of sp (sp_ring 1) or of 2 sp (sp_ring > 1);
// 0 <= sp_rank < sp.
at::Tensor shard_positions(int64_t padded_length, int64_t sp, int64_t sp_ring, int64_t sp_rank);

}  // namespace ulysses::data
