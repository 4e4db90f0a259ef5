// Packed q/k/v all-to-all, full-sequence local attention, all-to-all back (see header).
#include "sp/ulysses_attention.h"

#include "common/error.h"
#include "profile/phase_timer.h"
#include "sp/all_to_all.h"

namespace ulysses::sp {

int64_t kv_replication(int64_t hq, int64_t hkv, int64_t sp) {
  if (hq % sp != 0) {
    throw UserError("model.num_heads: " + std::to_string(hq) + " query heads are not divisible by mesh.sp = " +
                    std::to_string(sp));
  }
  if (hkv % sp == 0) return 1;
  if (sp % hkv == 0) return sp / hkv;
  throw UserError("model.num_kv_heads: " + std::to_string(hkv) +
                  " KV heads neither divide nor are a multiple of mesh.sp = " + std::to_string(sp));
}

UlyssesAttention::UlyssesAttention(comm::Group& group, model::AttentionBackend backend)
    : group_(group), backend_(backend) {}

std::string UlyssesAttention::name() const {
  return "ulysses(sp=" + std::to_string(group_.size()) + ", " +
         model::attention_backend_name(backend_) + ")";
}

at::Tensor UlyssesAttention::forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                     const model::AttentionContext& ctx) {
  const int64_t sp = group_.size();
  const int64_t bs = q.size(0), local_sl = q.size(1), hq = q.size(2), hd = q.size(3);
  const int64_t hkv = k.size(2);
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

  at::Tensor out_full;  // [bs, sl, hq/sp, hd]
  if (ctx.run_core) {
    profile::ScopedPhase phase("attention");
    out_full = model::local_attention(q_full, k_full, v_full, ctx.doc_ids, backend_,
                                      ctx.documents.get());
  } else {
    out_full = q_full * 0;  // keeps the graph connected; skip_all_but_last debug mode
  }

  // [bs, sl, hq/sp, hd] -> [sp(dest = sequence chunk), bs, sl/sp, hq/sp, hd]
  at::Tensor to_send = out_full.reshape({bs, sp, local_sl, hq_local, hd}).permute({1, 0, 2, 3, 4});
  // -> [sp(source = head group), bs, sl/sp, hq/sp, hd] -> [bs, sl/sp, hq, hd]
  at::Tensor back = all_to_all(to_send, group_);
  return back.permute({1, 2, 0, 3, 4}).reshape({bs, local_sl, hq, hd});
}

}  // namespace ulysses::sp
