// Zig-zag ring attention: forward with online softmax, backward with travelling K/V gradients
// (see ring_attention.h).
#include "sp/ring_attention.h"

#include <torch/csrc/autograd/custom_function.h>

#ifdef ULYSSES_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

#include "model/varlen_flash_attention.h"
#include "profile/phase_timer.h"

namespace ulysses::sp {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

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
// are materialised (hidden_keys), one block of query rows at a time; the flash kernels take the
// causal case as is and the documents as runs.
struct PairMask {
  Visibility visibility = Visibility::kNone;
  int64_t query_chunk = 0, key_chunk = 0;
  bool documents = false;           // documents must be separated within the pair
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
  mask.query_chunk = qc;
  mask.key_chunk = kc;
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


// How one call computes: the state of a rank's block in compute layout (heads first, queries
// grouped by KV head) and the kernels its pairs take. Blocks enter the kernels in `block` (the
// input dtype for the flash kernels, else `compute`); results accumulate in `compute` (fp32 for
// fp16/bf16 inputs, else the input dtype).
struct Layout {
  int64_t bs, length, hq, hkv, hd, group;
  at::ScalarType block, compute;
  bool flash;         // a flash kernel for every pair without a document mask
  bool varlen;        // the varlen kernel for pairs with documents (given as runs)
  int64_t tile_rows;  // query rows per score block of the math path
  double scale;       // 1/sqrt(hd)
  at::Tensor starts;  // run_starts of the documents (host), or undefined
  int64_t positions;  // P = 2RC, the whole sample
  RingStats* stats;   // or null
};

Layout layout_of(const at::Tensor& q, const at::Tensor& k, const RingOptions& options,
                 const at::Tensor& starts, int64_t positions) {
  const bool low_precision = q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16;
  const model::AttentionBackend backend = options.backend;
  const bool allows_flash =
      backend == model::AttentionBackend::kFlash || backend == model::AttentionBackend::kSdpaAuto;
  // The CPU flash kernel takes every floating dtype and head size.
  const bool cpu_flash = q.is_cpu() && backend != model::AttentionBackend::kMath;
  const bool cuda_flash = allows_flash && cuda_flash_runs(q);
  const bool flash = cpu_flash || cuda_flash;
  const at::ScalarType compute = low_precision ? at::kFloat : q.scalar_type();
  const int64_t bs = q.size(0), length = q.size(1), hq = q.size(2), hd = q.size(3);
  const int64_t chunk = length / 2;
  const int64_t row_bytes =
      bs * hq * chunk * static_cast<int64_t>(c10::elementSize(compute));  // one query row
  const int64_t tile_rows = std::clamp<int64_t>(
      options.score_block_bytes / std::max<int64_t>(row_bytes, 1), 1, std::max<int64_t>(chunk, 1));
  return {bs,
          length,
          hq,
          k.size(2),
          hd,
          hq / k.size(2),
          flash ? q.scalar_type() : compute,
          compute,
          flash,
          flash && starts.defined(),
          tile_rows,
          1.0 / std::sqrt(static_cast<double>(hd)),
          starts,
          positions,
          options.stats};
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

// The dense flash kernel's layout: [bs, hkv, g, C, hd] -> [bs, hq, C, hd]; keys expanded to every
// query head of their group.
at::Tensor heads_flat(const at::Tensor& t, const Layout& l) {
  return t.expand({l.bs, l.hkv, l.group, t.size(3), l.hd})
      .reshape({l.bs, l.hq, t.size(3), l.hd})
      .contiguous();
}

// The kernels a ring pair runs, as attention_kernels_used() names them, recorded once each.
enum class PairKernel { kFlash, kVarlen, kMath };
void record_once(PairKernel kernel) {
  static std::array<std::atomic<bool>, 3> seen{};
  static constexpr std::array<const char*, 3> kNames = {"ring_flash", "ring_flash_varlen",
                                                        "ring_math"};
  const auto index = static_cast<size_t>(kernel);
  if (!seen[index].exchange(true)) model::record_attention_kernel(kNames[index]);
}

PairKernel pair_kernel(const PairMask& mask, const Layout& l) {
  if (!mask.documents) return l.flash ? PairKernel::kFlash : PairKernel::kMath;
  return l.varlen ? PairKernel::kVarlen : PairKernel::kMath;
}

// One pair's result for the rows of a query chunk: out [bs, hkv, g, C, hd] and log-sum-exp
// [bs, hkv, g, C], both in the compute dtype (rows that see no key: out 0, lse -inf).
struct BlockResult {
  at::Tensor out, lse;
};

// ---- The math path: scores for a block of query rows at a time.

void note_score_block(const Layout& l, int64_t elements) {
  if (l.stats != nullptr) {
    l.stats->largest_score_block = std::max(l.stats->largest_score_block, elements);
  }
}

// Which keys the query rows [row, row + rows) of a pair hide: [bs or 1, rows, C] bool, or
// undefined when they see every key.
at::Tensor hidden_keys(const PairMask& mask, int64_t row, int64_t rows, int64_t chunk,
                       const at::Device& device) {
  at::Tensor hidden;
  if (mask.documents) {
    hidden = mask.query_docs.narrow(1, row, rows).unsqueeze(2).ne(mask.key_docs.unsqueeze(1));
  }
  if (mask.visibility == Visibility::kDiagonal) {
    const auto positions = at::TensorOptions().dtype(at::kLong).device(device);
    const at::Tensor later =  // key after query: [1, rows, C]
        at::arange(chunk, positions)
            .unsqueeze(0)
            .gt(at::arange(row, row + rows, positions).unsqueeze(1))
            .unsqueeze(0);
    hidden = hidden.defined() ? hidden.logical_or(later) : later;
  }
  return hidden;
}

// Scores of query rows [row, row + rows) ([bs, hkv, g, rows, hd], compute dtype) against the
// keys [bs, hkv, 1, C, hd], -inf where `mask` hides the key: [bs, hkv, g, rows, C].
at::Tensor masked_scores(const at::Tensor& rows, const at::Tensor& keys, const PairMask& mask,
                         int64_t row, const Layout& l) {
  at::Tensor scores = at::matmul(rows, keys.transpose(-1, -2)).mul_(l.scale);
  note_score_block(l, scores.numel());
  const int64_t count = rows.size(3), chunk = keys.size(3);
  const at::Tensor hidden = hidden_keys(mask, row, count, chunk, rows.device());
  if (hidden.defined()) {
    scores.masked_fill_(hidden.view({hidden.size(0), 1, 1, count, chunk}), -kInf);
  }
  return scores;
}

BlockResult math_forward(const at::Tensor& rows, const at::Tensor& keys, const at::Tensor& values,
                         const PairMask& mask, const Layout& l) {
  const int64_t chunk = rows.size(3);
  const at::Tensor k = keys.to(l.compute), v = values.to(l.compute);  // [bs, hkv, 1, C, hd]
  const auto options = k.options();
  BlockResult result{at::empty({l.bs, l.hkv, l.group, chunk, l.hd}, options),
                     at::empty({l.bs, l.hkv, l.group, chunk}, options)};
  for (int64_t row = 0; row < chunk; row += l.tile_rows) {
    const int64_t count = std::min(l.tile_rows, chunk - row);
    at::Tensor probs =
        masked_scores(rows.narrow(3, row, count).to(l.compute), k, mask, row, l);  // [.., n, C]
    const at::Tensor lse = at::logsumexp(probs, -1);                               // [.., n]
    probs.sub_(finite_or_zero(lse).unsqueeze(-1)).exp_();
    result.out.narrow(3, row, count).copy_(at::matmul(probs, v));
    result.lse.narrow(3, row, count).copy_(lse);
  }
  return result;
}

// Adds one pair's gradients through the math path; the arguments as block_backward's.
void math_backward(const at::Tensor& rows, const at::Tensor& keys, const at::Tensor& values,
                   const at::Tensor& grad_rows, const at::Tensor& lse, const at::Tensor& delta,
                   const PairMask& mask, const Layout& l, at::Tensor grad_q, at::Tensor grad_k,
                   at::Tensor grad_v) {
  const int64_t chunk = rows.size(3);
  const at::Tensor k = keys.to(l.compute), v = values.to(l.compute);  // [bs, hkv, 1, C, hd]
  for (int64_t row = 0; row < chunk; row += l.tile_rows) {
    const int64_t count = std::min(l.tile_rows, chunk - row);
    const std::array<int64_t, 4> folded = {l.bs, l.hkv, l.group * count, -1};  // group x rows
    const at::Tensor q = rows.narrow(3, row, count).to(l.compute);  // [bs, hkv, g, n, hd]
    const at::Tensor dout = grad_rows.narrow(3, row, count).to(l.compute);
    // The probabilities under the final log-sum-exp, as the flash backward recomputes them.
    at::Tensor probs = masked_scores(q, k, mask, row, l);  // [bs, hkv, g, n, C]
    probs.sub_(finite_or_zero(lse.narrow(3, row, count)).unsqueeze(-1)).exp_();
    // dV and dK sum over the group and the rows in one product each: [bs, hkv, C, hd].
    grad_v.add_(at::matmul(probs.reshape(folded).transpose(-1, -2), dout.reshape(folded)));
    at::Tensor d_scores = at::matmul(dout, v.transpose(-1, -2));  // [bs, hkv, g, n, C]
    note_score_block(l, d_scores.numel());
    d_scores.sub_(delta.narrow(3, row, count)).mul_(probs);
    probs = at::Tensor();
    grad_q.narrow(3, row, count).add_(at::matmul(d_scores, k), l.scale);
    grad_k.add_(at::matmul(d_scores.reshape(folded).transpose(-1, -2), q.reshape(folded)), l.scale);
  }
}

// ---- The varlen path: a document-masked pair as one varlen flash launch over the documents
// both chunks hold (on CPU one flash call per document). A full pair (key chunk before the query
// chunk) sees, per sample, the one document that spans from the key chunk into the query chunk,
// without a causal mask; a diagonal pair sees each of its documents causally. Query rows of
// documents absent from the key chunk get no contribution (out 0, lse -inf).

struct VarlenPair {
  model::VarlenRuns runs;
  int64_t rows = 0;                            // total_q (0: no document is in both chunks)
  c10::List<std::optional<at::Tensor>> query;  // the rows' (sample, position in the query chunk)
  c10::List<std::optional<at::Tensor>> key;    // the keys' (sample, position in the key chunk)
};

VarlenPair varlen_pair(const PairMask& mask, int64_t chunk, const Layout& l,
                       const at::Device& device) {
  const int64_t q0 = mask.query_chunk * chunk, k0 = mask.key_chunk * chunk;
  const int64_t width = l.starts.size(1);
  std::vector<int32_t> cu_q{0}, cu_k{0};
  std::vector<int64_t> q_sample, q_position, k_sample, k_position;
  for (int64_t b = 0; b < l.starts.size(0); ++b) {
    const int64_t* starts = l.starts.data_ptr<int64_t>() + b * width;
    const int64_t first = document_at(l.starts, b, q0),
                  last = document_at(l.starts, b, q0 + chunk - 1);
    for (int64_t d = first; d <= last; ++d) {
      const int64_t begin = starts[d], end = d + 1 < width ? starts[d + 1] : l.positions;
      const int64_t q_begin = std::max(begin, q0), q_end = std::min(end, q0 + chunk);
      const int64_t k_begin = std::max(begin, k0), k_end = std::min(end, k0 + chunk);
      if (q_begin >= q_end || k_begin >= k_end) continue;
      for (int64_t p = q_begin; p < q_end; ++p) {
        q_sample.push_back(b);
        q_position.push_back(p - q0);
      }
      for (int64_t p = k_begin; p < k_end; ++p) {
        k_sample.push_back(b);
        k_position.push_back(p - k0);
      }
      cu_q.push_back(static_cast<int32_t>(cu_q.back() + q_end - q_begin));
      cu_k.push_back(static_cast<int32_t>(cu_k.back() + k_end - k_begin));
    }
  }
  VarlenPair pair;
  pair.rows = cu_q.back();
  if (pair.rows == 0) return pair;
  pair.runs = model::varlen_runs(cu_q, cu_k, device);
  // The four index vectors in one host tensor, one copy.
  const int64_t nq = pair.rows, nk = cu_k.back();
  at::Tensor host = at::empty({2 * nq + 2 * nk}, at::TensorOptions(at::kLong));
  int64_t* out = host.data_ptr<int64_t>();
  for (const auto* part : {&q_sample, &q_position, &k_sample, &k_position}) {
    out = std::copy(part->begin(), part->end(), out);
  }
  const at::Tensor index =
      device.is_cuda() ? host.pin_memory().to(device, /*non_blocking=*/true) : host;
  pair.query.push_back(index.narrow(0, 0, nq));
  pair.query.push_back(index.narrow(0, nq, nq));
  pair.key.push_back(index.narrow(0, 2 * nq, nk));
  pair.key.push_back(index.narrow(0, 2 * nq + nk, nk));
  return pair;
}

// The selected rows of [bs, hkv, g, C, hd] as [total_q, hq, hd], and keys of [bs, hkv, 1, C, hd]
// as [total_k, hkv, hd] (contiguous, as the kernel takes them).
at::Tensor selected_rows(const at::Tensor& t, const VarlenPair& pair, const Layout& l) {
  return at::index(t.permute({0, 3, 1, 2, 4}), pair.query)
      .reshape({pair.rows, l.hq, l.hd})
      .contiguous();
}
at::Tensor selected_keys(const at::Tensor& t, const VarlenPair& pair) {
  return at::index(t.squeeze(2).permute({0, 2, 1, 3}), pair.key).contiguous();
}

BlockResult varlen_forward(const at::Tensor& rows, const at::Tensor& keys, const at::Tensor& values,
                           const PairMask& mask, const Layout& l) {
  const int64_t chunk = rows.size(3);
  const auto options = rows.options().dtype(l.compute);
  at::Tensor out = at::zeros({l.bs, chunk, l.hkv, l.group, l.hd}, options);
  at::Tensor lse = at::full({l.bs, chunk, l.hq}, -kInf, options);
  const VarlenPair pair = varlen_pair(mask, chunk, l, rows.device());
  if (pair.rows > 0) {
    const bool causal = mask.visibility == Visibility::kDiagonal;
    const model::VarlenOutput result =
        model::varlen_flash_forward(selected_rows(rows, pair, l), selected_keys(keys, pair),
                                    selected_keys(values, pair), pair.runs, causal, l.scale);
    out.index_put_(pair.query, result.out.view({pair.rows, l.hkv, l.group, l.hd}).to(l.compute));
    lse.index_put_(pair.query, result.lse.t().to(l.compute));  // [total_q, hq]
  }
  return {out.permute({0, 2, 3, 1, 4}),
          lse.view({l.bs, chunk, l.hkv, l.group}).permute({0, 2, 3, 1})};
}

void varlen_backward(const at::Tensor& rows, const at::Tensor& keys, const at::Tensor& values,
                     const at::Tensor& grad_rows, const at::Tensor& out, const at::Tensor& lse,
                     const PairMask& mask, const Layout& l, at::Tensor grad_q, at::Tensor grad_k,
                     at::Tensor grad_v) {
  const VarlenPair pair = varlen_pair(mask, rows.size(3), l, rows.device());
  if (pair.rows == 0) return;
  const bool causal = mask.visibility == Visibility::kDiagonal;
  const at::Tensor lse_rows =  // [hq, total_q] in the compute dtype
      at::index(lse.permute({0, 3, 1, 2}), pair.query).reshape({pair.rows, l.hq}).t();
  const at::Tensor k = selected_keys(keys, pair);
  auto [dq, dk, dv] =
      model::varlen_flash_backward(selected_rows(grad_rows, pair, l), selected_rows(rows, pair, l),
                                   k, selected_keys(values, pair), selected_rows(out, pair, l),
                                   lse_rows, pair.runs, causal, l.scale);
  grad_q.permute({0, 3, 1, 2, 4})
      .index_put_(pair.query, dq.view({pair.rows, l.hkv, l.group, l.hd}).to(l.compute),
                  /*accumulate=*/true);
  grad_k.permute({0, 2, 1, 3}).index_put_(pair.key, dk.to(l.compute), /*accumulate=*/true);
  grad_v.permute({0, 2, 1, 3}).index_put_(pair.key, dv.to(l.compute), /*accumulate=*/true);
}

// ---- One pair, whichever kernel it takes.

BlockResult block_forward(const at::Tensor& rows, const at::Tensor& keys, const at::Tensor& values,
                          const PairMask& mask, const Layout& l) {
  const PairKernel kernel = pair_kernel(mask, l);
  record_once(kernel);
  if (kernel == PairKernel::kMath) return math_forward(rows, keys, values, mask, l);
  if (kernel == PairKernel::kVarlen) return varlen_forward(rows, keys, values, mask, l);
  const int64_t chunk = rows.size(3);
  const bool causal = mask.visibility == Visibility::kDiagonal;
  const at::Tensor q = heads_flat(rows, l), k = heads_flat(keys, l), v = heads_flat(values, l);
  at::Tensor out, lse;
  if (q.is_cpu()) {
    std::tie(out, lse) =
        at::_scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, {}, l.scale);
  } else {
    auto result = at::_scaled_dot_product_flash_attention(q, k, v, 0.0, causal, false, l.scale);
    out = std::get<0>(result), lse = std::get<1>(result);
  }
  return {out.to(l.compute).view({l.bs, l.hkv, l.group, chunk, l.hd}),
          lse.to(l.compute).view({l.bs, l.hkv, l.group, chunk})};
}

// Adds one pair's gradients: to the rows' dq [bs, hkv, g, C, hd] and the key chunk's dk, dv
// [bs, hkv, C, hd] (compute dtype). `out` and `lse` are the rows' final results (the flash
// kernels take out in the input dtype), `delta` rowsum(dO * O) [bs, hkv, g, C, 1].
void block_backward(const at::Tensor& rows, const at::Tensor& keys, const at::Tensor& values,
                    const at::Tensor& grad_rows, const at::Tensor& out, const at::Tensor& lse,
                    const at::Tensor& delta, const PairMask& mask, const Layout& l,
                    at::Tensor grad_q, at::Tensor grad_k, at::Tensor grad_v) {
  const PairKernel kernel = pair_kernel(mask, l);
  if (kernel == PairKernel::kMath) {
    math_backward(rows, keys, values, grad_rows, lse, delta, mask, l, grad_q, grad_k, grad_v);
    return;
  }
  if (kernel == PairKernel::kVarlen) {
    varlen_backward(rows, keys, values, grad_rows, out, lse, mask, l, grad_q, grad_k, grad_v);
    return;
  }
  const int64_t chunk = rows.size(3);
  const bool causal = mask.visibility == Visibility::kDiagonal;
  const at::Tensor q = heads_flat(rows, l), k = heads_flat(keys, l), v = heads_flat(values, l);
  const at::Tensor dout = heads_flat(grad_rows, l), o = heads_flat(out, l);
  const at::Tensor lse_flat = lse.reshape({l.bs, l.hq, chunk}).contiguous();
  at::Tensor dq, dk, dv;
  if (q.is_cpu()) {
    std::tie(dq, dk, dv) = at::_scaled_dot_product_flash_attention_for_cpu_backward(
        dout, q, k, v, o, lse_flat, 0.0, causal, {}, l.scale);
  } else {
    const at::Tensor none = at::empty({0}, q.options().dtype(at::kLong));
    std::tie(dq, dk, dv) = at::_scaled_dot_product_flash_attention_backward(
        dout, q, k, v, o, lse_flat, at::Tensor(), at::Tensor(), chunk, chunk, 0.0, causal, none,
        none, l.scale);
  }
  const std::array<int64_t, 5> grouped = {l.bs, l.hkv, l.group, chunk, l.hd};
  grad_q.add_(dq.view(grouped));
  // Summed over the query group in the compute dtype: no rounding to fp16/bf16 on the way.
  grad_k.add_(dk.view(grouped).sum(2, /*keepdim=*/false, l.compute));
  grad_v.add_(dv.view(grouped).sum(2, /*keepdim=*/false, l.compute));
}

// What goes into the function besides q/k/v, wrapped: autograd takes every tensor argument for an
// input that may need a gradient, which an undefined one cannot be.
struct Extras {
  at::Tensor ids;            // [bs, P] or undefined
  const DocumentRuns* runs;  // their runs on the host, or null (found from ids)
  RingOptions options;
};

struct RingAttentionFunction : public torch::autograd::Function<RingAttentionFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q,
                            const at::Tensor& k, const at::Tensor& v, Extras extras,
                            int64_t group_address) {
    const at::Tensor& doc_ids = extras.ids;
    comm::Group& ring = *reinterpret_cast<comm::Group*>(group_address);
    const int64_t size = ring.size(), me = ring.rank();
    if (extras.options.stats != nullptr) *extras.options.stats = RingStats{};
    const at::Tensor starts = run_starts(doc_ids, extras.runs);  // [bs, runs] host
    const Layout l = layout_of(q, k, extras.options, starts, q.size(1) * size);
    const int64_t chunk = l.length / 2;

    const at::Tensor queries = queries_first(q, l);  // [bs, hkv, g, L, hd]
    at::Tensor out = at::zeros(queries.sizes(), queries.options().dtype(l.compute));
    at::Tensor lse = at::full({l.bs, l.hkv, l.group, l.length}, -kInf,
                              out.options());  // [bs, hkv, g, L]
    at::Tensor kv = pack_kv(k, v);             // [2, bs, hkv, L, hd], the block of rank `source`
    for (int64_t step = 0; step < size; ++step) {
      const int64_t source = (me - step + size) % size;
      comm::Group::Pending next;
      const bool more = step + 1 < size;
      if (more) next = shift_start(ring, kv);
      for_each_visible_pair(
          me, source, size, chunk, doc_ids, starts, q.device(),
          [&](int qi, int ki, const PairMask& mask) {
            const BlockResult block =
                block_forward(queries.narrow(3, qi * chunk, chunk), key_chunk(kv, 0, ki, chunk, l),
                              key_chunk(kv, 1, ki, chunk, l), mask, l);
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
    ctx->saved_data["backend"] = static_cast<int64_t>(extras.options.backend);
    ctx->saved_data["score_block_bytes"] = extras.options.score_block_bytes;
    ctx->saved_data["stats"] = reinterpret_cast<int64_t>(extras.options.stats);
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
    RingOptions options;
    options.backend = static_cast<model::AttentionBackend>(ctx->saved_data["backend"].toInt());
    options.score_block_bytes = ctx->saved_data["score_block_bytes"].toInt();
    options.stats = reinterpret_cast<RingStats*>(ctx->saved_data["stats"].toInt());
    const at::Tensor starts = ctx->saved_data["starts"].toTensor();
    const Layout l = layout_of(q, k, options, starts, q.size(1) * size);
    const int64_t chunk = l.length / 2;

    const at::Tensor queries = queries_first(q, l);          // [bs, hkv, g, L, hd]
    const at::Tensor grad_out = queries_first(grads[0], l);  // [bs, hkv, g, L, hd]
    const at::Tensor outputs = queries_first(result, l);     // [bs, hkv, g, L, hd]
    // D = rowsum(dO * O): the softmax backward's per-row term.
    const at::Tensor delta = (grad_out.to(l.compute) * outputs.to(l.compute))
                                 .sum(-1, /*keepdim=*/true);  // [bs, hkv, g, L, 1]
    at::Tensor grad_q = at::zeros(queries.sizes(), queries.options().dtype(l.compute));
    at::Tensor kv = pack_kv(k, v);  // [2, bs, hkv, L, hd]
    // This rank's contribution to the gradient of the block held at each step, in the compute
    // dtype: two buffers in turn, each zeroed for reuse once its last pass has been waited for.
    std::array<at::Tensor, 2> contributions;
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
      at::Tensor& grad_kv = contributions[step % 2];
      if (grad_kv.defined()) {
        grad_kv.zero_();  // its pass (step - 2) was waited for at step - 1
      } else {
        grad_kv = at::zeros(kv.sizes(), kv.options().dtype(l.compute));
      }
      for_each_visible_pair(
          me, source, size, chunk, doc_ids, starts, q.device(),
          [&](int qi, int ki, const PairMask& mask) {
            const auto rows = [&](const at::Tensor& t) { return t.narrow(3, qi * chunk, chunk); };
            block_backward(
                rows(queries), key_chunk(kv, 0, ki, chunk, l), key_chunk(kv, 1, ki, chunk, l),
                rows(grad_out), rows(outputs), rows(lse), rows(delta), mask, l, rows(grad_q),
                grad_kv[0].narrow(2, ki * chunk, chunk), grad_kv[1].narrow(2, ki * chunk, chunk));
          });
      if (step > 0) grad_kv.add_(shift_wait(passed, grad_kv.sizes()));
      passed = shift_start(ring, grad_kv);
      if (more) kv = shift_wait(next, kv.sizes());
    }
    const at::Tensor grad_kv = shift_wait(passed, kv.sizes());  // this rank's block, summed
    const at::Tensor dq =
        grad_q.permute({0, 3, 1, 2, 4}).reshape({l.bs, l.length, l.hq, l.hd}).to(q.scalar_type());
    const at::Tensor dkv = grad_kv.permute({0, 1, 3, 2, 4});  // [2, bs, L, hkv, hd]
    return {dq, dkv[0].to(k.scalar_type()), dkv[1].to(v.scalar_type()), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

bool cuda_flash_runs(const at::Tensor& q) {
  const bool half = q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16;
  const int64_t hd = q.size(-1);
  if (!q.is_cuda() || !half || hd % 8 != 0 || hd > 256) return false;
#ifdef ULYSSES_WITH_CUDA
  return at::cuda::getDeviceProperties(q.get_device())->major >= 8;
#else
  return false;
#endif
}

at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const at::Tensor& doc_ids, const DocumentRuns* documents,
                          comm::Group& ring, const RingOptions& options) {
  TORCH_CHECK(q.dim() == 4 && k.sizes() == v.sizes() && q.size(0) == k.size(0) &&
                  q.size(1) == k.size(1) && q.size(3) == k.size(3) && q.size(2) % k.size(2) == 0 &&
                  q.size(1) % 2 == 0,
              "ring_attention: q ", q.sizes(), ", k ", k.sizes(), ", v ", v.sizes());
  TORCH_CHECK(!doc_ids.defined() || (doc_ids.dim() == 2 && doc_ids.size(0) == q.size(0) &&
                                     doc_ids.size(1) == q.size(1) * ring.size()),
              "ring_attention: doc_ids ", doc_ids.sizes(), " for blocks of ", q.size(1),
              " positions over ", ring.size(), " ranks");
  TORCH_CHECK(options.score_block_bytes > 0, "ring_attention: score_block_bytes ",
              options.score_block_bytes);
  return RingAttentionFunction::apply(q, k, v, Extras{doc_ids, documents, options},
                                      reinterpret_cast<int64_t>(&ring));
}

}  // namespace ulysses::sp
