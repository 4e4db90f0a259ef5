// Ulysses sequence-parallel attention: each rank holds sl/sp positions of every head;
// one packed all-to-all turns that into all sl positions of hq/sp heads, attention runs over the
// full sequence locally, and one all-to-all turns the output back. With uneven heads allowed, an
// sp that does not divide the heads gives each rank ceil or floor(hq/sp) of them (head_split.h).
// With a ring (mesh.sp_ring) the exchange runs over the SP group's all-to-all part and assembles
// this ring rank's zig-zag block instead of the whole sequence; attention over it is ring attention
// (ring_attention.h).
#pragma once
#include <memory>
#include <vector>

#include "comm/group.h"
#include "model/attention_core.h"
#include "sp/head_split.h"

namespace ulysses::sp {

// Checks the head rules of the even exchange with degree sp and returns how many times each KV
// head is replicated before it: 1 when hkv % sp == 0, sp / hkv when sp % hkv == 0.
// Throws UserError("model.num_kv_heads: ...") / ("model.num_heads: ...", naming
// mesh.uneven_heads) otherwise.
int64_t kv_replication(int64_t hq, int64_t hkv, int64_t sp);

// One attention call over a rank's uneven heads: query heads [q_offset, q_offset + q_count) of
// the rank's query range with KV heads [kv_offset, kv_offset + kv_count) of its KV range, each KV
// head used by q_count / kv_count consecutive query heads (GQA by grouping, as local_attention and
// ring_attention take it).
struct HeadSegment {
  int64_t q_offset = 0, q_count = 0;
  int64_t kv_offset = 0, kv_count = 0;
};

// `heads` cut into the fewest runs that are each GQA by grouping: consecutive KV heads that serve
// equally many of the rank's query heads form one run. Whole groups are one run; a range that
// starts or ends inside a group (it straddles groups) adds a run for each partial group, so at
// most 3 runs, and 1 when every KV head serves equally many. Every query head and every KV head of
// `heads` is in exactly one run, in order.
// REQUIRES: heads == uneven_rank_heads(hq, hkv, sp, rank) for some sp and rank.
std::vector<HeadSegment> gqa_segments(const RankHeads& heads, int64_t hq, int64_t hkv);

class UlyssesAttention : public model::AttentionCore {
 public:
  // `group` is the group the heads are exchanged over (the SP group, or its all-to-all part with
  // a ring); it must outlive this object and every autograd graph built through it. `backend` is
  // the resolved local attention backend. `uneven_heads` (mesh.uneven_heads) allows head counts
  // the even exchange cannot split. `ring` (the SP group's ring part, or null / a group of one
  // for none): attention over the exchanged block runs as ring attention over it
  // (ring_attention.h) instead of locally; the block is then this ring rank's zig-zag block.
  UlyssesAttention(comm::Group& group, model::AttentionBackend backend,
                   bool uneven_heads = false, comm::Group* ring = nullptr);

  // q [bs, sl/sp, hq, hd], k/v [bs, sl/sp, hkv, hd] with RoPE applied at global positions
  //   -> packed exchange [sp, bs, sl/sp, (hq + 2 hkv')/sp, hd] -> [sp, bs, sl/sp, ...]
  //   -> local attention on q [bs, sl, hq/sp, hd], k/v [bs, sl, hkv'/sp, hd]
  //   -> exchange back -> [bs, sl/sp, hq, hd].   (hkv' = hkv * kv_replication)
  // When heads_split_evenly(hq, hkv, sp) is false and uneven heads are allowed: group rank r gets
  // the heads of uneven_rank_heads(hq, hkv, sp, r) (hq_r query, hkv_r KV heads), and the
  // exchanges send uneven flat chunks:
  //   -> to rank r [bs, sl/sp, hq_r + 2 hkv_r, hd] -> [sp, bs, sl/sp, hq_r + 2 hkv_r, hd] here
  //   -> attention over gqa_segments(heads): per segment q [bs, sl, q_count, hd] with only its own
  //      k/v [bs, sl, kv_count, hd] (no KV head repeated per query head), in one local (or ring)
  //      call each; their outputs side by side are [bs, sl, hq_r, hd]. With a ring, the members
  //      of one ring hold the same heads, so they make the same ring calls in the same order.
  //   -> back: [bs, sl/sp, hq_s, hd] from each rank s -> [bs, sl/sp, hq, hd].
  // ctx.doc_ids, when defined, is [bs, sl] for the full sequence.
  at::Tensor forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const model::AttentionContext& ctx) override;
  std::string name() const override;

  // What one call of the attention over the exchanged block (local or ring attention) received.
  struct CoreCall {
    int64_t q_heads = 0, kv_heads = 0;
  };
  // The attention calls of the latest forward() (one layer's, or its recompute's), in order.
  // Read it only while no forward runs.
  const std::vector<CoreCall>& last_core_calls() const { return last_calls_; }

 private:
  // The uneven split for one model's heads; depends only on hq, hkv, sp and this rank.
  struct UnevenPlan {
    int64_t hq = 0, hkv = 0;
    std::vector<RankHeads> split;       // every group rank's heads, by group rank
    std::vector<int64_t> split_flat;    // the same as q_begin, q_count, kv_begin, kv_count each
    std::vector<HeadSegment> segments;  // this rank's attention calls
  };
  // The plan for (hq, hkv), made on the first call with those head counts and kept.
  const UnevenPlan& uneven_plan(int64_t hq, int64_t hkv);

  at::Tensor forward_uneven(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const model::AttentionContext& ctx);

  at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                    const model::AttentionContext& ctx);

  comm::Group& group_;
  comm::Group* ring_;  // null: no ring
  model::AttentionBackend backend_;
  bool uneven_heads_;
  UnevenPlan plan_;                   // hq == 0: not made yet
  std::vector<CoreCall> last_calls_;  // see last_core_calls()
};

}  // namespace ulysses::sp
