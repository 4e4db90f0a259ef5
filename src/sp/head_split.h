// How Ulysses attention splits one layer's heads over the ranks of an SP group: evenly (sp divides
// hq, and the KV heads divide or are replicated evenly) or, with mesh.uneven_heads, in contiguous
// ranges of ceil or floor(hq/sp) query heads with the KV heads those use.
#pragma once
#include <cstdint>

#include "config/mesh_factors.h"

namespace ulysses::sp {

// One rank's heads: query heads [q_begin, q_begin + q_count) and the KV heads they use,
// [kv_begin, kv_begin + kv_count) (query head h uses KV head h / (hq / hkv)).
struct RankHeads {
  int64_t q_begin = 0, q_count = 0;
  int64_t kv_begin = 0, kv_count = 0;
};

// True when the even exchange applies: hq % sp == 0 and (hkv % sp == 0 or sp % hkv == 0).
using config::heads_split_evenly;

// Group rank `rank`'s heads in the uneven split: the first hq % sp ranks take ceil(hq/sp) query
// heads, the others floor(hq/sp), in rank order; a KV head used by several ranks is on each of
// them (its gradient is the sum of theirs). When sp divides hq this is the even split of the query
// heads. REQUIRES: 1 <= sp <= hq, hkv >= 1, hq % hkv == 0, 0 <= rank < sp.
RankHeads uneven_rank_heads(int64_t hq, int64_t hkv, int64_t sp, int64_t rank);

// The most query heads and the most KV heads one rank holds at degree sp, with the even split
// where it applies (KV heads replicated up to one per rank) and the uneven one otherwise: what
// the slowest rank computes and receives.
// REQUIRES: as uneven_rank_heads (without rank).
struct HeadLoad {
  int64_t q = 0, kv = 0;
};
HeadLoad max_rank_heads(int64_t hq, int64_t hkv, int64_t sp);

}  // namespace ulysses::sp
