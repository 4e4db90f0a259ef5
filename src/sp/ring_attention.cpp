// Zig-zag ring attention: forward with online softmax, backward with travelling K/V gradients
// (see ring_attention.h).
#include "sp/ring_attention.h"

#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

#include "model/attention_core.h"
#include "profile/phase_timer.h"

namespace ulysses::sp {
namespace {

// How a query chunk sees a key chunk under the causal mask.
enum class Visibility { kNone, kDiagonal, kFull };

Visibility visibility(int64_t query_chunk, int64_t key_chunk) {
  if (key_chunk < query_chunk) return Visibility::kFull;
  return key_chunk == query_chunk ? Visibility::kDiagonal : Visibility::kNone;
}

// The two chunks of ring rank `r`'s block, in block order.
std::array<int64_t, 2> block_chunks(int64_t r, int64_t ring_size) {
  return {r, 2 * ring_size - 1 - r};
}

// Sends `t` (flat) to the next ring rank and receives the previous rank's: the K/V pass.
comm::Group::Pending shift_start(comm::Group& ring, const at::Tensor& t) {
  const int64_t n = t.numel(), size = ring.size(), me = ring.rank();
  std::vector<int64_t> send(size, 0), receive(size, 0);
  send[(me + 1) % size] = n;
  receive[(me + size - 1) % size] = n;
  return ring.all_to_all_start(t.reshape({-1}), receive, send);
}

at::Tensor shift_wait(comm::Group::Pending& pending, c10::IntArrayRef shape) {
  profile::ScopedPhase phase("ring");
  return pending.wait().view(shape);
}

// -inf (a row that sees nothing yet) -> 0, so that exp(x - safe) is 0 rather than NaN.
at::Tensor finite_or_zero(const at::Tensor& lse) {
  return at::where(at::isinf(lse), at::zeros_like(lse), lse);
}

// Where each sample's documents start, on the host: [bs, runs] int64, each row ascending and padded
// with P, or undefined when there are no documents or the ids do not form runs (then every pair is
// masked). The document of a position is the number of starts at or before it, minus one.
at::Tensor run_starts(const at::Tensor& doc_ids, const DocumentRuns* runs) {
  if (!doc_ids.defined()) return at::Tensor();
  DocumentRuns found;
  if (runs == nullptr) {
    found = document_runs(doc_ids);  // one device-to-host copy when the batch did not bring them
    runs = &found;
  }
  if (runs->empty()) return at::Tensor();
  size_t most = 0;
  for (const auto& row : *runs) most = std::max(most, row.size());
  std::vector<int64_t> flat(runs->size() * most, doc_ids.size(1));  // [bs, most], padded with P
  for (size_t b = 0; b < runs->size(); ++b) {
    for (size_t i = 0; i < (*runs)[b].size(); ++i) flat[b * most + i] = (*runs)[b][i].first;
  }
  return at::tensor(flat, at::TensorOptions().dtype(at::kLong))
      .view({static_cast<int64_t>(runs->size()), static_cast<int64_t>(most)});
}

int64_t document_at(const at::Tensor& starts, int64_t row, int64_t position) {
  const int64_t width = starts.size(1);
  const int64_t* begin = starts.data_ptr<int64_t>() + row * width;
  return std::upper_bound(begin, begin + width, position) - begin - 1;
}

// Which key positions each query row of a pair of chunks sees: the causal visibility, and with
// `documents` also only keys of the row's document. The mask itself is built only where scores
// are materialised (masked_scores); the flash kernel takes the causal case as is.
struct PairMask {
  Visibility visibility = Visibility::kNone;
  bool documents = false;       // documents must be separated within the pair
  at::Tensor query_docs, key_docs;  // [bs, C] document ids on the compute device, when documents
};

// The mask of query chunk `qc` against key chunk `kc` (chunks of C positions), or kNone when no
// query row sees any key. `starts` (run_starts, host) decides without touching the device: a pair
// whose chunks lie after each other's documents is skipped, one inside a single document needs no
// document mask; the others carry their documents (doc_ids, on the compute device) for the mask.
PairMask pair_mask(int64_t qc, int64_t kc, int64_t chunk, const at::Tensor& doc_ids,
                   const at::Tensor& starts, const at::Device& device) {
  PairMask mask;
  mask.visibility = visibility(qc, kc);
  if (mask.visibility == Visibility::kNone) return mask;
  bool one_document = false;
  if (doc_ids.defined() && starts.defined()) {
    bool none = true;
    one_document = true;
    for (int64_t b = 0; b < starts.size(0); ++b) {
      const int64_t first_query = document_at(starts, b, qc * chunk);
      const int64_t last_query = document_at(starts, b, (qc + 1) * chunk - 1);
      const int64_t first_key = document_at(starts, b, kc * chunk);
      const int64_t last_key = document_at(starts, b, (kc + 1) * chunk - 1);
      none = none && first_query > last_key;
      one_document = one_document && first_query == last_query && first_key == last_key &&
                     first_query == first_key;
    }
    if (none) {
      mask.visibility = Visibility::kNone;
      return mask;
    }
  }
  if (doc_ids.defined() && !one_document) {
    mask.documents = true;
    mask.query_docs = doc_ids.narrow(1, qc * chunk, chunk).to(device);  // [bs, C]
    mask.key_docs = doc_ids.narrow(1, kc * chunk, chunk).to(device);    // [bs, C]
  }
  return mask;
}

// Calls visit(qi, ki, mask) for each pair of this rank's chunk qi (0, 1) and the chunk ki of ring
// rank `source`'s block that some query row sees, under the "attention" phase.
template <class Visit>
void for_each_visible_pair(int64_t me, int64_t source, int64_t size, int64_t chunk,
                           const at::Tensor& doc_ids, const at::Tensor& starts,
                           const at::Device& device, Visit&& visit) {
  profile::ScopedPhase phase("attention");
  const std::array<int64_t, 2> mine = block_chunks(me, size), theirs = block_chunks(source, size);
  for (int qi = 0; qi < 2; ++qi) {
    for (int ki = 0; ki < 2; ++ki) {
      const PairMask mask = pair_mask(mine[qi], theirs[ki], chunk, doc_ids, starts, device);
      if (mask.visibility != Visibility::kNone) visit(qi, ki, mask);
    }
  }
}

// Scores of query rows [bs, hkv, g, C, hd] against keys [bs, hkv, 1, C, hd], -inf where `mask`
// hides the key.
at::Tensor masked_scores(const at::Tensor& q, const at::Tensor& k, const PairMask& mask,
                         double scale) {
  at::Tensor scores = at::matmul(q, k.transpose(-1, -2)).mul_(scale);  // [bs, hkv, g, C, C]
  const int64_t chunk = scores.size(-1);
  at::Tensor hidden;  // [bs or 1, C, C] bool
  if (mask.documents) hidden = mask.query_docs.unsqueeze(2).ne(mask.key_docs.unsqueeze(1));
  if (mask.visibility == Visibility::kDiagonal) {
    const at::Tensor later =  // key after query
        at::ones({1, chunk, chunk}, scores.options().dtype(at::kBool)).triu(1);
    hidden = hidden.defined() ? hidden.logical_or(later) : later;
  }
  if (hidden.defined()) {
    scores.masked_fill_(hidden.view({hidden.size(0), 1, 1, chunk, chunk}),
                        -std::numeric_limits<double>::infinity());
  }
  return scores;
}

// The state of one rank's block in compute layout: heads first, queries grouped by KV head.
// Blocks enter the kernels in `block` (the input dtype for the fused kernels, else `compute`);
// results accumulate in `compute` (fp32 for fp16/bf16 inputs, else the input dtype).
struct Layout {
  int64_t bs, length, hq, hkv, hd, group;
  at::ScalarType block, compute;
  bool fused;  // SDPA's flash kernel for every pair without a document mask
};

Layout layout_of(const at::Tensor& q, const at::Tensor& k, bool fused_requested) {
  const bool low_precision = q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16;
  // CUDA's flash kernel takes fp16/bf16 with a head size that is a multiple of 8 up to 256 (SDPA
  // pads other sizes; called directly it refuses them); the CPU one every floating dtype and size.
  const int64_t hd = q.size(3);
  const bool fused = fused_requested &&
                     (q.is_cpu() || (q.is_cuda() && low_precision && hd % 8 == 0 && hd <= 256));
  const at::ScalarType compute = low_precision ? at::kFloat : q.scalar_type();
  return {q.size(0),         q.size(1), q.size(2), k.size(2), q.size(3), q.size(2) / k.size(2),
          fused ? q.scalar_type() : compute, compute, fused};
}

// [bs, L, hq, hd] -> [bs, hkv, g, L, hd] in the block dtype.
at::Tensor queries_first(const at::Tensor& q, const Layout& l) {
  return q.to(l.block)
      .reshape({l.bs, l.length, l.hkv, l.group, l.hd})
      .permute({0, 2, 3, 1, 4})
      .contiguous();
}

// [bs, L, hkv, hd] x 2 -> one [2, bs, hkv, L, hd] buffer in the input dtype (what travels).
at::Tensor pack_kv(const at::Tensor& k, const at::Tensor& v) {
  return at::stack({k, v}).permute({0, 1, 3, 2, 4}).contiguous();
}

// One key chunk of a packed [2, bs, hkv, L, hd] buffer in the block dtype, with a unit
// query-group dim.
at::Tensor key_chunk(const at::Tensor& kv, int which, int64_t index, int64_t chunk,
                     const Layout& l) {
  return kv[which].narrow(2, index * chunk, chunk).unsqueeze(2).to(l.block);  // [bs,hkv,1,C,hd]
}

// The fused kernels' layout: [bs, hkv, g, C, hd] -> [bs, hq, C, hd]; keys expanded to every
// query head of their group.
at::Tensor heads_flat(const at::Tensor& t, const Layout& l) {
  return t.expand({l.bs, l.hkv, l.group, t.size(3), l.hd})
      .reshape({l.bs, l.hq, t.size(3), l.hd})
      .contiguous();
}

// The kernels a ring pair runs, as attention_kernels_used() names them, recorded once each.
constexpr const char* kRingFlash = "ring_flash";
constexpr const char* kRingMath = "ring_math";
void record_once(const char* kernel) {
  static std::atomic<bool> flash{false}, math{false};
  std::atomic<bool>& seen = kernel == kRingFlash ? flash : math;
  if (!seen.exchange(true)) model::record_attention_kernel(kernel);
}

// One pair's result for the rows of a query chunk: out [bs, hkv, g, C, hd] and log-sum-exp
// [bs, hkv, g, C], both in the compute dtype.
struct BlockResult {
  at::Tensor out, lse;
};

BlockResult block_forward(const at::Tensor& rows, const at::Tensor& keys, const at::Tensor& values,
                          const PairMask& mask, double scale, const Layout& l) {
  const int64_t chunk = rows.size(3);
  if (l.fused && !mask.documents) {
    record_once(kRingFlash);
    const bool causal = mask.visibility == Visibility::kDiagonal;
    const at::Tensor q = heads_flat(rows, l), k = heads_flat(keys, l), v = heads_flat(values, l);
    at::Tensor out, lse;
    if (q.is_cpu()) {
      std::tie(out, lse) =
          at::_scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, {}, scale);
    } else {
      auto result = at::_scaled_dot_product_flash_attention(q, k, v, 0.0, causal, false, scale);
      out = std::get<0>(result), lse = std::get<1>(result);
    }
    return {out.to(l.compute).view({l.bs, l.hkv, l.group, chunk, l.hd}),
            lse.to(l.compute).view({l.bs, l.hkv, l.group, chunk})};
  }
  record_once(kRingMath);
  const at::Tensor scores =
      masked_scores(rows.to(l.compute), keys.to(l.compute), mask, scale);  // [bs,hkv,g,C,C]
  at::Tensor lse = at::logsumexp(scores, -1);                              // [bs, hkv, g, C]
  const at::Tensor probs = at::exp(scores - finite_or_zero(lse).unsqueeze(-1));
  return {at::matmul(probs, values.to(l.compute)), lse};
}

// Adds one pair's gradients: to the rows' dq [bs, hkv, g, C, hd] and the key chunk's dk, dv
// [bs, hkv, C, hd] (compute dtype). `out` and `lse` are the rows' final results (the fused
// kernels take out in the input dtype), `delta` rowsum(dO * O) [bs, hkv, g, C, 1].
void block_backward(const at::Tensor& rows, const at::Tensor& keys, const at::Tensor& values,
                    const at::Tensor& grad_rows, const at::Tensor& out, const at::Tensor& lse,
                    const at::Tensor& delta, const PairMask& mask, double scale, const Layout& l,
                    at::Tensor grad_q, at::Tensor grad_k, at::Tensor grad_v) {
  const int64_t chunk = rows.size(3);
  if (l.fused && !mask.documents) {
    const bool causal = mask.visibility == Visibility::kDiagonal;
    const at::Tensor q = heads_flat(rows, l), k = heads_flat(keys, l), v = heads_flat(values, l);
    const at::Tensor dout = heads_flat(grad_rows, l), o = heads_flat(out, l);
    const at::Tensor lse_flat = lse.reshape({l.bs, l.hq, chunk}).contiguous();
    at::Tensor dq, dk, dv;
    if (q.is_cpu()) {
      std::tie(dq, dk, dv) = at::_scaled_dot_product_flash_attention_for_cpu_backward(
          dout, q, k, v, o, lse_flat, 0.0, causal, {}, scale);
    } else {
      const at::Tensor none = at::empty({0}, q.options().dtype(at::kLong));
      std::tie(dq, dk, dv) = at::_scaled_dot_product_flash_attention_backward(
          dout, q, k, v, o, lse_flat, at::Tensor(), at::Tensor(), chunk, chunk, 0.0, causal, none,
          none, scale);
    }
    const std::array<int64_t, 5> grouped = {l.bs, l.hkv, l.group, chunk, l.hd};
    grad_q.add_(dq.view(grouped));
    grad_k.add_(dk.view(grouped).sum(2));
    grad_v.add_(dv.view(grouped).sum(2));
    return;
  }
  const at::Tensor q = rows.to(l.compute), k = keys.to(l.compute), v = values.to(l.compute);
  const at::Tensor dout = grad_rows.to(l.compute);
  const at::Tensor probs = at::exp(masked_scores(q, k, mask, scale) -
                                   finite_or_zero(lse).unsqueeze(-1));  // [bs, hkv, g, C, C]
  grad_v.add_(at::matmul(probs.transpose(-1, -2), dout).sum(2));
  const at::Tensor d_scores = probs * (at::matmul(dout, v.transpose(-1, -2)) - delta);
  grad_q.add_(at::matmul(d_scores, k), scale);
  grad_k.add_(at::matmul(d_scores.transpose(-1, -2), q).sum(2), scale);
}

// The documents go into the function wrapped: autograd takes every tensor argument for an input
// that may need a gradient, which an undefined one cannot be.
struct Documents {
  at::Tensor ids;                 // [bs, P] or undefined
  const DocumentRuns* runs;       // their runs on the host, or null (found from ids)
};

struct RingAttentionFunction : public torch::autograd::Function<RingAttentionFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q,
                            const at::Tensor& k, const at::Tensor& v, Documents documents,
                            int64_t group_address, bool fused) {
    const at::Tensor& doc_ids = documents.ids;
    comm::Group& ring = *reinterpret_cast<comm::Group*>(group_address);
    const int64_t size = ring.size(), me = ring.rank();
    const Layout l = layout_of(q, k, fused);
    const int64_t chunk = l.length / 2;
    const double scale = 1.0 / std::sqrt(static_cast<double>(l.hd));
    const at::Tensor starts = run_starts(doc_ids, documents.runs);  // [bs, runs] host

    const at::Tensor queries = queries_first(q, l);  // [bs, hkv, g, L, hd]
    at::Tensor out = at::zeros(queries.sizes(), queries.options().dtype(l.compute));
    at::Tensor lse = at::full({l.bs, l.hkv, l.group, l.length},
                              -std::numeric_limits<double>::infinity(),
                              out.options());  // [bs, hkv, g, L]
    at::Tensor kv = pack_kv(k, v);  // [2, bs, hkv, L, hd], the block of rank `source`
    for (int64_t step = 0; step < size; ++step) {
      const int64_t source = (me - step + size) % size;
      comm::Group::Pending next;
      const bool more = step + 1 < size;
      if (more) next = shift_start(ring, kv);
      for_each_visible_pair(me, source, size, chunk, doc_ids, starts, q.device(),
                            [&](int qi, int ki, const PairMask& mask) {
        const BlockResult block = block_forward(
            queries.narrow(3, qi * chunk, chunk), key_chunk(kv, 0, ki, chunk, l),
            key_chunk(kv, 1, ki, chunk, l), mask, scale, l);
        // Online softmax: merge the block's result into the rows' running one.
        at::Tensor out_rows = out.narrow(3, qi * chunk, chunk);
        at::Tensor lse_rows = lse.narrow(3, qi * chunk, chunk);
        const at::Tensor high = finite_or_zero(at::maximum(lse_rows, block.lse));
        const at::Tensor merged =
            high + at::log(at::exp(lse_rows - high) + at::exp(block.lse - high));
        const at::Tensor base = finite_or_zero(merged);
        out_rows.copy_(out_rows * at::exp(lse_rows - base).unsqueeze(-1) +
                       block.out * at::exp(block.lse - base).unsqueeze(-1));
        lse_rows.copy_(merged);
      });
      if (more) kv = shift_wait(next, kv.sizes());
    }
    const at::Tensor result =
        out.permute({0, 3, 1, 2, 4}).reshape({l.bs, l.length, l.hq, l.hd}).to(q.scalar_type());
    ctx->save_for_backward({q, k, v, result, lse});
    ctx->saved_data["group"] = group_address;
    ctx->saved_data["doc_ids"] = doc_ids;
    ctx->saved_data["starts"] = starts;
    ctx->saved_data["fused"] = fused;
    return result;
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &result = saved[3],
                     &lse = saved[4];
    comm::Group& ring = *reinterpret_cast<comm::Group*>(ctx->saved_data["group"].toInt());
    const at::Tensor doc_ids = ctx->saved_data["doc_ids"].toTensor();
    const int64_t size = ring.size(), me = ring.rank();
    const Layout l = layout_of(q, k, ctx->saved_data["fused"].toBool());
    const int64_t chunk = l.length / 2;
    const double scale = 1.0 / std::sqrt(static_cast<double>(l.hd));
    const at::Tensor starts = ctx->saved_data["starts"].toTensor();

    const at::Tensor queries = queries_first(q, l);          // [bs, hkv, g, L, hd]
    const at::Tensor grad_out = queries_first(grads[0], l);  // [bs, hkv, g, L, hd]
    const at::Tensor outputs = queries_first(result, l);     // [bs, hkv, g, L, hd]
    // D = rowsum(dO * O): the softmax backward's per-row term.
    const at::Tensor delta = (grad_out.to(l.compute) * outputs.to(l.compute))
                                 .sum(-1, /*keepdim=*/true);  // [bs, hkv, g, L, 1]
    at::Tensor grad_q = at::zeros(queries.sizes(), queries.options().dtype(l.compute));
    at::Tensor kv = pack_kv(k, v);  // [2, bs, hkv, L, hd]
    // The gradient of the block held at each step, summed over the ranks that held it before,
    // arrives from the previous rank while this step computes; this rank adds its own and passes
    // the sum on while the next step computes. The pass after the last step brings this rank's
    // own block's gradient, summed over every rank.
    comm::Group::Pending passed;
    for (int64_t step = 0; step < size; ++step) {
      const int64_t source = (me - step + size) % size;
      comm::Group::Pending next;
      const bool more = step + 1 < size;
      if (more) next = shift_start(ring, kv);
      // This rank's contribution to the gradient of the block held now, in the compute dtype.
      at::Tensor grad_kv = at::zeros(kv.sizes(), kv.options().dtype(l.compute));
      for_each_visible_pair(me, source, size, chunk, doc_ids, starts, q.device(),
                            [&](int qi, int ki, const PairMask& mask) {
        const auto rows = [&](const at::Tensor& t) { return t.narrow(3, qi * chunk, chunk); };
        block_backward(rows(queries), key_chunk(kv, 0, ki, chunk, l),
                       key_chunk(kv, 1, ki, chunk, l), rows(grad_out), rows(outputs), rows(lse),
                       rows(delta), mask, scale, l, rows(grad_q),
                       grad_kv[0].narrow(2, ki * chunk, chunk),
                       grad_kv[1].narrow(2, ki * chunk, chunk));
      });
      if (step > 0) grad_kv.add_(shift_wait(passed, grad_kv.sizes()));
      passed = shift_start(ring, grad_kv);
      if (more) kv = shift_wait(next, kv.sizes());
    }
    const at::Tensor grad_kv = shift_wait(passed, kv.sizes());  // this rank's block, summed
    const at::Tensor dq =
        grad_q.permute({0, 3, 1, 2, 4}).reshape({l.bs, l.length, l.hq, l.hd}).to(q.scalar_type());
    const at::Tensor dkv = grad_kv.permute({0, 1, 3, 2, 4});  // [2, bs, L, hkv, hd]
    return {dq,           dkv[0].to(k.scalar_type()), dkv[1].to(v.scalar_type()), at::Tensor(),
            at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const at::Tensor& doc_ids, const DocumentRuns* documents,
                          comm::Group& ring, bool fused) {
  TORCH_CHECK(q.dim() == 4 && k.sizes() == v.sizes() && q.size(0) == k.size(0) &&
                  q.size(1) == k.size(1) && q.size(3) == k.size(3) && q.size(2) % k.size(2) == 0 &&
                  q.size(1) % 2 == 0,
              "ring_attention: q ", q.sizes(), ", k ", k.sizes(), ", v ", v.sizes());
  TORCH_CHECK(!doc_ids.defined() || (doc_ids.dim() == 2 && doc_ids.size(0) == q.size(0) &&
                                     doc_ids.size(1) == q.size(1) * ring.size()),
              "ring_attention: doc_ids ", doc_ids.sizes(), " for blocks of ", q.size(1),
              " positions over ", ring.size(), " ranks");
  return RingAttentionFunction::apply(q, k, v, Documents{doc_ids, documents},
                                      reinterpret_cast<int64_t>(&ring), fused);
}

}  // namespace ulysses::sp
