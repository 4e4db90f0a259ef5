// Even and uneven head splits of Ulysses attention (see header).
#include "sp/head_split.h"

#include <c10/util/Exception.h>

#include <algorithm>

namespace ulysses::sp {

RankHeads uneven_rank_heads(int64_t hq, int64_t hkv, int64_t sp, int64_t rank) {
  TORCH_CHECK(sp >= 1 && sp <= hq && hkv >= 1 && hq % hkv == 0 && rank >= 0 && rank < sp,
              "uneven_rank_heads: hq ", hq, ", hkv ", hkv, ", sp ", sp, ", rank ", rank);
  const int64_t floor_count = hq / sp, ceil_ranks = hq % sp, group = hq / hkv;
  RankHeads heads;
  heads.q_count = floor_count + (rank < ceil_ranks ? 1 : 0);
  heads.q_begin = rank * floor_count + std::min(rank, ceil_ranks);
  heads.kv_begin = heads.q_begin / group;
  heads.kv_count = (heads.q_begin + heads.q_count - 1) / group - heads.kv_begin + 1;
  return heads;
}

HeadLoad max_rank_heads(int64_t hq, int64_t hkv, int64_t sp) {
  if (heads_split_evenly(hq, hkv, sp)) return {hq / sp, std::max<int64_t>(hkv / sp, 1)};
  HeadLoad load;
  for (int64_t rank = 0; rank < sp; ++rank) {
    const RankHeads heads = uneven_rank_heads(hq, hkv, sp, rank);
    load.q = std::max(load.q, heads.q_count);
    load.kv = std::max(load.kv, heads.kv_count);
  }
  return load;
}

}  // namespace ulysses::sp
