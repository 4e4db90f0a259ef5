// Packed q/k/v all-to-all, full-sequence local attention, all-to-all back (see header).
#include "sp/ulysses_attention.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "common/error.h"
#include "profile/phase_timer.h"
#include "sp/all_to_all.h"
#include "sp/head_split.h"
#include "sp/ring_attention.h"

namespace ulysses::sp {
int64_t kv_replication(int64_t hq, int64_t hkv, int64_t sp) {
  if (hq % sp != 0) {
    throw UserError("model.num_heads: " + std::to_string(hq) +
                    " query heads are not divisible by mesh.sp = " + std::to_string(sp) +
                    " (mesh.uneven_heads: true splits them unevenly)");
  }
  if (hkv % sp == 0) return 1;
  if (sp % hkv == 0) return sp / hkv;
  throw UserError("model.num_kv_heads: " + std::to_string(hkv) +
                  " KV heads neither divide nor are a multiple of mesh.sp = " + std::to_string(sp) +
                  " (mesh.uneven_heads: true splits them unevenly)");
}

UlyssesAttention::UlyssesAttention(comm::Group& group, model::AttentionBackend backend,
                                   bool uneven_heads, comm::Group* ring)
    : group_(group),
      ring_(ring != nullptr && ring->size() > 1 ? ring : nullptr),
      backend_(backend),
      uneven_heads_(uneven_heads) {}

std::string UlyssesAttention::name() const {
  const std::string ring = ring_ ? ", ring " + std::to_string(ring_->size()) : "";
  return "ulysses(sp=" + std::to_string(group_.size()) + ring + ", " +
         model::attention_backend_name(backend_) + ")";
}

// Attention over the exchanged block for this rank's heads: over the whole sequence locally, or
// over the ring; or (skip_all_but_last debug mode) zeros that keep the graph connected.
at::Tensor UlyssesAttention::attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const model::AttentionContext& ctx) const {
  if (!ctx.run_core) return q * 0;
  if (ring_ != nullptr) {
    return ring_attention(q, k, v, ctx.doc_ids, ctx.documents.get(), *ring_,
                          backend_ != model::AttentionBackend::kMath);
  }
  profile::ScopedPhase phase("attention");
  return model::local_attention(q, k, v, ctx.doc_ids, backend_, ctx.documents.get());
}

at::Tensor UlyssesAttention::forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                     const model::AttentionContext& ctx) {
  const int64_t sp = group_.size();
  if (sp == 1) return attend(q, k, v, ctx);  // a ring alone: no heads to exchange
  const int64_t bs = q.size(0), local_sl = q.size(1), hq = q.size(2), hd = q.size(3);
  const int64_t hkv = k.size(2);
  if (uneven_heads_ && !heads_split_evenly(hq, hkv, sp)) return forward_uneven(q, k, v, ctx);
  const int64_t replicas = kv_replication(hq, hkv, sp);
  // GQA/MQA with fewer KV heads than ranks: each KV head serves sp/hkv ranks (replicas of it).
  const int64_t hq_local = hq / sp, hkv_local = hkv * replicas / sp;
  const int64_t heads_per_rank = hq_local + 2 * hkv_local;

  // Pack once, destination first: each of q, k, v is copied straight into its slot of the send
  // buffer (no concatenated intermediate, no replicated K/V tensor, no second contiguous copy).
  at::Tensor packed = at::empty({sp, bs, local_sl, heads_per_rank, hd},
                                q.options());  // [sp(dest), bs, sl/sp, hpr, hd]
  // Heads of t [bs, sl/sp, H, hd] for each destination, written into packed's heads
  // [offset, offset + H * r / sp). With r == 1, destination d gets heads d*H/sp ..; with r > 1
  // (then H * r == sp) destination d gets head d / r.
  auto pack = [&](const at::Tensor& t, int64_t offset, int64_t r) {
    const int64_t heads = t.size(2), per_rank = heads * r / sp;
    at::Tensor slot = packed.narrow(3, offset, per_rank);  // [sp, bs, sl/sp, per_rank, hd]
    if (r == 1) {
      slot.copy_(t.reshape({bs, local_sl, sp, per_rank, hd}).permute({2, 0, 1, 3, 4}));
    } else {
      slot.view({heads, r, bs, local_sl, 1, hd})
          .copy_(t.reshape({bs, local_sl, heads, 1, 1, hd})
                     .expand({bs, local_sl, heads, r, 1, hd})
                     .permute({2, 3, 0, 1, 4, 5}));
    }
  };
  pack(q, 0, 1);
  pack(k, hq_local, replicas);
  pack(v, hq_local + hkv_local, replicas);
  // [sp(dest), bs, sl/sp, hpr, hd] -> [sp(source = sequence chunk), bs, sl/sp, hpr, hd]
  at::Tensor received = all_to_all(packed, group_);
  at::Tensor full = received.permute({1, 0, 2, 3, 4})
                        .reshape({bs, sp * local_sl, received.size(3), hd});  // [bs, sl, hpr, hd]
  at::Tensor q_full = full.narrow(2, 0, hq_local);                 // [bs, sl, hq/sp, hd]
  at::Tensor k_full = full.narrow(2, hq_local, hkv_local);         // [bs, sl, hkv'/sp, hd]
  at::Tensor v_full = full.narrow(2, hq_local + hkv_local, hkv_local);

  const at::Tensor out_full = attend(q_full, k_full, v_full, ctx);  // [bs, sl, hq/sp, hd]

  // [bs, sl, hq/sp, hd] -> [sp(dest = sequence chunk), bs, sl/sp, hq/sp, hd]
  at::Tensor to_send = out_full.reshape({bs, sp, local_sl, hq_local, hd}).permute({1, 0, 2, 3, 4});
  // -> [sp(source = head group), bs, sl/sp, hq/sp, hd] -> [bs, sl/sp, hq, hd]
  at::Tensor back = all_to_all(to_send, group_);
  return back.permute({1, 2, 0, 3, 4}).reshape({bs, local_sl, hq, hd});
}

at::Tensor UlyssesAttention::forward_uneven(const at::Tensor& q, const at::Tensor& k,
                                            const at::Tensor& v,
                                            const model::AttentionContext& ctx) {
  const int64_t sp = group_.size(), me = group_.rank();
  const int64_t bs = q.size(0), local_sl = q.size(1), hq = q.size(2), hd = q.size(3);
  const int64_t hkv = k.size(2);
  TORCH_CHECK(sp <= hq && hq % hkv == 0, "uneven Ulysses heads: hq ", hq, ", hkv ", hkv, ", sp ",
              sp);
  std::vector<RankHeads> split(sp);
  for (int64_t r = 0; r < sp; ++r) split[r] = uneven_rank_heads(hq, hkv, sp, r);
  const int64_t head_elems = bs * local_sl * hd;  // one head of one sequence chunk

  // Pack destination first into one flat buffer: for rank d, [bs, sl/sp, hq_d + 2 hkv_d, hd].
  // A KV head several ranks use is copied once for each; autograd sums their gradients here.
  std::vector<int64_t> send_splits(sp), recv_splits(sp);
  for (int64_t d = 0; d < sp; ++d) {
    send_splits[d] = (split[d].q_count + 2 * split[d].kv_count) * head_elems;
  }
  const RankHeads& mine = split[me];
  const int64_t my_heads = mine.q_count + 2 * mine.kv_count;
  std::fill(recv_splits.begin(), recv_splits.end(), my_heads * head_elems);
  at::Tensor packed = at::empty(  // [sum over d of bs * sl/sp * (hq_d + 2 hkv_d) * hd]
      {std::accumulate(send_splits.begin(), send_splits.end(), int64_t{0})}, q.options());
  int64_t offset = 0;
  for (int64_t d = 0; d < sp; ++d) {
    const RankHeads& h = split[d];
    at::Tensor slot = packed.narrow(0, offset, send_splits[d])
                          .view({bs, local_sl, h.q_count + 2 * h.kv_count, hd});
    slot.narrow(2, 0, h.q_count).copy_(q.narrow(2, h.q_begin, h.q_count));
    slot.narrow(2, h.q_count, h.kv_count).copy_(k.narrow(2, h.kv_begin, h.kv_count));
    slot.narrow(2, h.q_count + h.kv_count, h.kv_count).copy_(v.narrow(2, h.kv_begin, h.kv_count));
    offset += send_splits[d];
  }
  // -> [sp(source = sequence chunk), bs, sl/sp, my_heads, hd] -> [bs, sl, my_heads, hd]
  at::Tensor received = all_to_all(packed, group_, recv_splits, send_splits);
  at::Tensor full = received.view({sp, bs, local_sl, my_heads, hd})
                        .permute({1, 0, 2, 3, 4})
                        .reshape({bs, sp * local_sl, my_heads, hd});
  at::Tensor q_full = full.narrow(2, 0, mine.q_count);                 // [bs, sl, hq_r, hd]
  at::Tensor k_full = full.narrow(2, mine.q_count, mine.kv_count);     // [bs, sl, hkv_r, hd]
  at::Tensor v_full = full.narrow(2, mine.q_count + mine.kv_count, mine.kv_count);

  // Local query head i uses KV head (q_begin + i) / group - kv_begin. local_attention groups
  // query head i with KV head i / (hq_r / hkv_r); where a range does not start and end on group
  // boundaries those differ, and each query head gets its own KV head instead (MHA locally).
  const int64_t group = hq / hkv;
  std::vector<int64_t> kv_of_query(mine.q_count);
  bool grouped = mine.q_count % mine.kv_count == 0;
  for (int64_t i = 0; i < mine.q_count; ++i) {
    kv_of_query[i] = (mine.q_begin + i) / group - mine.kv_begin;
    if (grouped) grouped = kv_of_query[i] == i / (mine.q_count / mine.kv_count);
  }
  if (!grouped) {
    const at::Tensor index =
        at::tensor(kv_of_query, at::TensorOptions().dtype(at::kLong)).to(q.device());
    k_full = k_full.index_select(2, index);  // [bs, sl, hq_r, hd]
    v_full = v_full.index_select(2, index);
  }

  const at::Tensor out_full = attend(q_full, k_full, v_full, ctx);  // [bs, sl, hq_r, hd]

  // [bs, sl, hq_r, hd] -> [sp(dest = sequence chunk), bs, sl/sp, hq_r, hd], flat
  at::Tensor to_send = out_full.reshape({bs, sp, local_sl, mine.q_count, hd})
                           .permute({1, 0, 2, 3, 4})
                           .reshape({-1});
  std::vector<int64_t> back_splits(sp);
  for (int64_t s = 0; s < sp; ++s) back_splits[s] = split[s].q_count * head_elems;
  const std::vector<int64_t> out_splits(sp, mine.q_count * head_elems);  // equal chunks
  at::Tensor back = all_to_all(to_send, group_, back_splits, out_splits);
  // From rank s: [bs, sl/sp, hq_s, hd], its query heads in order -> [bs, sl/sp, hq, hd]
  std::vector<at::Tensor> pieces;
  offset = 0;
  for (int64_t s = 0; s < sp; ++s) {
    pieces.push_back(
        back.narrow(0, offset, back_splits[s]).view({bs, local_sl, split[s].q_count, hd}));
    offset += back_splits[s];
  }
  return at::cat(pieces, 2);
}

}  // namespace ulysses::sp
