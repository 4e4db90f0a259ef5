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
  // GQA/MQA with fewer KV heads than ranks: each KV head serves sp/hkv ranks.
  at::Tensor k_rep = replicas == 1 ? k : k.repeat_interleave(replicas, /*dim=*/2);  // [bs, sl/sp, hkv', hd]
  at::Tensor v_rep = replicas == 1 ? v : v.repeat_interleave(replicas, /*dim=*/2);
  const int64_t hq_local = hq / sp, hkv_local = k_rep.size(2) / sp;

  // Pack: split heads into sp groups and put the destination rank first.
  auto by_dest = [&](const at::Tensor& t, int64_t heads_per_rank) {
    return t.reshape({bs, local_sl, sp, heads_per_rank, hd});  // [bs, sl/sp, sp, h/sp, hd]
  };
  at::Tensor packed = at::cat({by_dest(q, hq_local), by_dest(k_rep, hkv_local),
                               by_dest(v_rep, hkv_local)},
                              /*dim=*/3)
                          .permute({2, 0, 1, 3, 4});  // [sp, bs, sl/sp, (hq+2hkv')/sp, hd]
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
    out_full = model::local_attention(q_full, k_full, v_full, ctx.doc_ids, backend_);
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
