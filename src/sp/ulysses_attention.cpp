// Packed q/k/v all-to-all, full-sequence local attention, all-to-all back (see header).
#include "sp/ulysses_attention.h"

#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "common/error.h"
#include "profile/phase_timer.h"
#include "sp/all_to_all.h"
#include "sp/head_split.h"
#include "sp/ring_attention.h"

namespace ulysses::sp {
namespace {

// The uneven exchange's send buffer, destination first: for rank d, [bs, sl/sp, hq_d + 2 hkv_d, hd]
// (its query heads, then its KV heads of k, then of v), flat. The backward gathers each slot's
// gradient back in one pass over the buffer, a KV head sent to several ranks getting their sum
// (autograd's backward of slot-by-slot copies into one buffer would copy the whole buffer once per
// slot). `split` holds q_begin, q_count, kv_begin, kv_count of every destination in rank order.
struct UnevenPackFunction : public torch::autograd::Function<UnevenPackFunction> {
  // q [bs, sl/sp, hq, hd], k/v [bs, sl/sp, hkv, hd] -> [sum over d of bs*sl/sp*(hq_d+2hkv_d)*hd]
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q,
                            const at::Tensor& k, const at::Tensor& v, std::vector<int64_t> split) {
    int64_t heads = 0;  // over all slots
    for (size_t d = 0; d < split.size(); d += 4) heads += split[d + 1] + 2 * split[d + 3];
    at::Tensor packed = at::empty({q.size(0) * q.size(1) * heads * q.size(3)}, q.options());
    walk_slots(packed, q.size(0), q.size(1), q.size(3), split,
               [&](const at::Tensor& slot_q, const at::Tensor& slot_k, const at::Tensor& slot_v,
                   const int64_t* h) {
                 slot_q.copy_(q.narrow(2, h[0], h[1]));
                 slot_k.copy_(k.narrow(2, h[2], h[3]));
                 slot_v.copy_(v.narrow(2, h[2], h[3]));
               });
    ctx->saved_data["split"] = std::move(split);
    ctx->saved_data["shape"] = std::vector<int64_t>{q.size(0), q.size(1), q.size(2), k.size(2),
                                                    q.size(3)};
    return packed;
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const std::vector<int64_t> split = ctx->saved_data["split"].toIntVector();
    const std::vector<int64_t> shape = ctx->saved_data["shape"].toIntVector();
    const at::Tensor& grad = grads[0];  // as the packed buffer
    if (!grad.defined()) return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    const int64_t bs = shape[0], local_sl = shape[1], hq = shape[2], hkv = shape[3];
    const int64_t hd = shape[4];
    // Every query head went to one destination, a KV head to one or more: those are summed in
    // fp32 for bf16/fp16 gradients and rounded once.
    const bool reduced = grad.scalar_type() == at::kBFloat16 || grad.scalar_type() == at::kHalf;
    const auto sums = grad.options().dtype(reduced ? at::kFloat : grad.scalar_type());
    at::Tensor grad_q = at::empty({bs, local_sl, hq, hd}, grad.options());
    at::Tensor grad_k = at::zeros({bs, local_sl, hkv, hd}, sums);
    at::Tensor grad_v = at::zeros({bs, local_sl, hkv, hd}, sums);
    walk_slots(grad, bs, local_sl, hd, split,
               [&](const at::Tensor& slot_q, const at::Tensor& slot_k, const at::Tensor& slot_v,
                   const int64_t* h) {
                 grad_q.narrow(2, h[0], h[1]).copy_(slot_q);
                 grad_k.narrow(2, h[2], h[3]).add_(slot_k);
                 grad_v.narrow(2, h[2], h[3]).add_(slot_v);
               });
    return {grad_q, grad_k.to(grad.scalar_type()), grad_v.to(grad.scalar_type()), at::Tensor()};
  }

  // Calls fn(q part, k part, v part, &split[4 d]) with the parts of each destination d's slot of
  // `buffer`: [bs, sl/sp, q_count, hd], [bs, sl/sp, kv_count, hd] x 2.
  template <typename Fn>
  static void walk_slots(const at::Tensor& buffer, int64_t bs, int64_t local_sl, int64_t hd,
                         const std::vector<int64_t>& split, Fn fn) {
    int64_t offset = 0;
    for (size_t d = 0; d < split.size(); d += 4) {
      const int64_t q_count = split[d + 1], kv_count = split[d + 3];
      const int64_t heads = q_count + 2 * kv_count;
      const at::Tensor slot =
          buffer.narrow(0, offset, bs * local_sl * heads * hd).view({bs, local_sl, heads, hd});
      fn(slot.narrow(2, 0, q_count), slot.narrow(2, q_count, kv_count),
         slot.narrow(2, q_count + kv_count, kv_count), &split[d]);
      offset += bs * local_sl * heads * hd;
    }
  }
};

}  // namespace

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

std::vector<HeadSegment> gqa_segments(const RankHeads& heads, int64_t hq, int64_t hkv) {
  const int64_t group = hq / hkv, q_end = heads.q_begin + heads.q_count;
  std::vector<HeadSegment> segments;
  for (int64_t j = 0; j < heads.kv_count; ++j) {
    const int64_t kv = heads.kv_begin + j;
    const int64_t first = std::max(heads.q_begin, kv * group);  // its first query head here
    const int64_t count = std::min(q_end, (kv + 1) * group) - first;
    HeadSegment* last = segments.empty() ? nullptr : &segments.back();
    if (last != nullptr && last->q_count == last->kv_count * count) {
      last->q_count += count;  // as many query heads as the run's KV heads have: it grows
      ++last->kv_count;
    } else {
      segments.push_back({first - heads.q_begin, count, j, 1});
    }
  }
  return segments;
}

UlyssesAttention::UlyssesAttention(comm::Group& group, model::AttentionBackend backend,
                                   bool uneven_heads, comm::Group* ring)
    : group_(group),
      ring_(ring != nullptr && ring->size() > 1 ? ring : nullptr),
      backend_(backend),
      uneven_heads_(uneven_heads) {}

std::string UlyssesAttention::name() const {
  const std::string ring = ring_ ? ", ring " + std::to_string(ring_->size()) : "";
  // The ring runs flash kernels only (flash or auto): under efficient or cudnn its pairs take the
  // tiled math path, which the name says, since it is slower than the backend chosen suggests.
  const bool math_pairs = ring_ && (backend_ == model::AttentionBackend::kEfficient ||
                                    backend_ == model::AttentionBackend::kCudnn);
  return "ulysses(sp=" + std::to_string(group_.size()) + ring + ", " +
         model::attention_backend_name(backend_) +
         (math_pairs ? "; ring pairs through the math path" : "") + ")";
}

// Attention over the exchanged block for this rank's heads: over the whole sequence locally, or
// over the ring; or (skip_all_but_last debug mode) zeros that keep the graph connected.
at::Tensor UlyssesAttention::attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const model::AttentionContext& ctx) {
  last_calls_.push_back({q.size(2), k.size(2)});
  if (!ctx.run_core) return q * 0;
  if (ring_ != nullptr) {
    RingOptions options;  // the user's backend: flash where it runs, the math path elsewhere
    options.backend = backend_;
    return ring_attention(q, k, v, ctx.doc_ids, ctx.documents.get(), *ring_, options);
  }
  profile::ScopedPhase phase("attention");
  return model::local_attention(q, k, v, ctx.doc_ids, backend_, ctx.documents.get());
}

at::Tensor UlyssesAttention::forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                     const model::AttentionContext& ctx) {
  last_calls_.clear();
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

const UlyssesAttention::UnevenPlan& UlyssesAttention::uneven_plan(int64_t hq, int64_t hkv) {
  if (plan_.hq == hq && plan_.hkv == hkv) return plan_;
  const int64_t sp = group_.size();
  TORCH_CHECK(sp <= hq && hq % hkv == 0, "uneven Ulysses heads: hq ", hq, ", hkv ", hkv, ", sp ",
              sp);
  plan_.hq = hq, plan_.hkv = hkv;
  plan_.split.resize(sp);
  for (int64_t r = 0; r < sp; ++r) plan_.split[r] = uneven_rank_heads(hq, hkv, sp, r);
  plan_.split_flat.clear();
  for (const RankHeads& h : plan_.split) {
    plan_.split_flat.insert(plan_.split_flat.end(), {h.q_begin, h.q_count, h.kv_begin, h.kv_count});
  }
  plan_.segments = gqa_segments(plan_.split[group_.rank()], hq, hkv);
  return plan_;
}

at::Tensor UlyssesAttention::forward_uneven(const at::Tensor& q, const at::Tensor& k,
                                            const at::Tensor& v,
                                            const model::AttentionContext& ctx) {
  const int64_t sp = group_.size(), me = group_.rank();
  const int64_t bs = q.size(0), local_sl = q.size(1), hq = q.size(2), hd = q.size(3);
  const UnevenPlan& plan = uneven_plan(hq, k.size(2));
  const std::vector<RankHeads>& split = plan.split;
  const int64_t head_elems = bs * local_sl * hd;  // one head of one sequence chunk

  // Pack destination first into one flat buffer: for rank d, [bs, sl/sp, hq_d + 2 hkv_d, hd].
  // A KV head several ranks use is copied once for each; the backward sums their gradients.
  std::vector<int64_t> send_splits(sp), recv_splits(sp);
  for (int64_t d = 0; d < sp; ++d) {
    send_splits[d] = (split[d].q_count + 2 * split[d].kv_count) * head_elems;
  }
  const RankHeads& mine = split[me];
  const int64_t my_heads = mine.q_count + 2 * mine.kv_count;
  std::fill(recv_splits.begin(), recv_splits.end(), my_heads * head_elems);
  const at::Tensor packed = UnevenPackFunction::apply(q, k, v, plan.split_flat);
  // -> [sp(source = sequence chunk), bs, sl/sp, my_heads, hd] -> [bs, sl, my_heads, hd]
  at::Tensor received = all_to_all(packed, group_, recv_splits, send_splits);
  at::Tensor full = received.view({sp, bs, local_sl, my_heads, hd})
                        .permute({1, 0, 2, 3, 4})
                        .reshape({bs, sp * local_sl, my_heads, hd});

  // Attention per GQA segment of this rank's heads, each with only its own KV heads: a range that
  // straddles KV groups neither repeats a KV head per query head nor sends one around the ring
  // more than once. Each segment's output goes straight into the layout sent back:
  // [bs, sl, q_count, hd] -> [sp(dest = sequence chunk), bs, sl/sp, q_count, hd].
  // One split (its backward is one concatenation) into the segments' q, then k, then v heads.
  const size_t segments = plan.segments.size();
  std::vector<int64_t> sizes(3 * segments);
  for (size_t i = 0; i < segments; ++i) {
    sizes[i] = plan.segments[i].q_count;
    sizes[segments + i] = sizes[2 * segments + i] = plan.segments[i].kv_count;
  }
  const std::vector<at::Tensor> parts = at::split_with_sizes(full, sizes, 2);
  std::vector<at::Tensor> outputs;
  for (size_t i = 0; i < segments; ++i) {
    // q [bs, sl, q_count, hd], k/v [bs, sl, kv_count, hd] -> [bs, sl, q_count, hd]
    const at::Tensor out = attend(parts[i], parts[segments + i], parts[2 * segments + i], ctx);
    outputs.push_back(out.reshape({bs, sp, local_sl, plan.segments[i].q_count, hd})
                          .permute({1, 0, 2, 3, 4}));
  }
  // [sp(dest), bs, sl/sp, hq_r, hd], flat (one copy pass, as the even exchange's)
  const at::Tensor to_send =
      (outputs.size() == 1 ? outputs[0] : at::cat(outputs, 3)).contiguous().view({-1});
  std::vector<int64_t> back_splits(sp);
  for (int64_t s = 0; s < sp; ++s) back_splits[s] = split[s].q_count * head_elems;
  const std::vector<int64_t> out_splits(sp, mine.q_count * head_elems);  // equal chunks
  at::Tensor back = all_to_all(to_send, group_, back_splits, out_splits);
  // From rank s: [bs, sl/sp, hq_s, hd], its query heads in order -> [bs, sl/sp, hq, hd]
  std::vector<at::Tensor> pieces;
  int64_t offset = 0;
  for (int64_t s = 0; s < sp; ++s) {
    pieces.push_back(
        back.narrow(0, offset, back_splits[s]).view({bs, local_sl, split[s].q_count, hd}));
    offset += back_splits[s];
  }
  return at::cat(pieces, 2);
}

}  // namespace ulysses::sp
