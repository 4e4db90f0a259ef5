// Ulysses sequence-parallel attention: each rank holds sl/sp positions of every head;
// one packed all-to-all turns that into all sl positions of hq/sp heads, attention runs over the
// full sequence locally, and one all-to-all turns the output back. With uneven heads allowed, an
// sp that does not divide the heads gives each rank ceil or floor(hq/sp) of them (head_split.h).
// With a ring (mesh.sp_ring) the exchange runs over the SP group's all-to-all part and assembles
// this ring rank's zig-zag block instead of the whole sequence; attention over it is ring attention
// (ring_attention.h).
#pragma once
#include <memory>

#include "comm/group.h"
#include "model/attention_core.h"

namespace ulysses::sp {

// Checks the head rules of the even exchange with degree sp and returns how many times each KV
// head is replicated before it: 1 when hkv % sp == 0, sp / hkv when sp % hkv == 0.
// Throws UserError("model.num_kv_heads: ...") / ("model.num_heads: ...", naming
// mesh.uneven_heads) otherwise.
int64_t kv_replication(int64_t hq, int64_t hkv, int64_t sp);

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
  //   -> local attention on q [bs, sl, hq_r, hd], k/v [bs, sl, hkv_r, hd]
  //   -> back: [bs, sl/sp, hq_s, hd] from each rank s -> [bs, sl/sp, hq, hd].
  // ctx.doc_ids, when defined, is [bs, sl] for the full sequence.
  at::Tensor forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const model::AttentionContext& ctx) override;
  std::string name() const override;

 private:
  at::Tensor forward_uneven(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const model::AttentionContext& ctx);

  at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                    const model::AttentionContext& ctx) const;

  comm::Group& group_;
  comm::Group* ring_;  // null: no ring
  model::AttentionBackend backend_;
  bool uneven_heads_;
};

}  // namespace ulysses::sp
