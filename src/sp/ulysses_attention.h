// Ulysses sequence-parallel attention: each rank holds sl/sp positions of every head;
// one packed all-to-all turns that into all sl positions of hq/sp heads, attention runs over the
// full sequence locally, and one all-to-all turns the output back.
#pragma once
#include <memory>

#include "comm/group.h"
#include "model/attention_core.h"

namespace ulysses::sp {

// Checks the head rules for Ulysses with degree sp and returns how many times each KV head is
// replicated before the exchange: 1 when hkv % sp == 0, sp / hkv when sp % hkv == 0.
// Throws UserError("model.num_kv_heads: ...") / ("model.num_heads: ...") otherwise.
int64_t kv_replication(int64_t hq, int64_t hkv, int64_t sp);

class UlyssesAttention : public model::AttentionCore {
 public:
  // `group` is the SP group (size sp); it must outlive this object and every autograd graph
  // built through it. `backend` is the resolved local attention backend.
  UlyssesAttention(comm::Group& group, model::AttentionBackend backend);

  // q [bs, sl/sp, hq, hd], k/v [bs, sl/sp, hkv, hd] with RoPE applied at global positions
  //   -> packed exchange [sp, bs, sl/sp, (hq + 2 hkv')/sp, hd] -> [sp, bs, sl/sp, ...]
  //   -> local attention on q [bs, sl, hq/sp, hd], k/v [bs, sl, hkv'/sp, hd]
  //   -> exchange back -> [bs, sl/sp, hq, hd].   (hkv' = hkv * kv_replication)
  // ctx.doc_ids, when defined, is [bs, sl] for the full sequence.
  at::Tensor forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const model::AttentionContext& ctx) override;
  std::string name() const override;

 private:
  comm::Group& group_;
  model::AttentionBackend backend_;
};

}  // namespace ulysses::sp
