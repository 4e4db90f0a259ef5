// One varlen flash-attention launch per call for packed documents (see varlen_flash_attention.h).
// The ATen ops are declared in every LibTorch build and implemented for CUDA only, so this file
// compiles everywhere and runs only where varlen_flash_applies.
#include "model/varlen_flash_attention.h"

#include <torch/autograd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <optional>

namespace ulysses::model {
namespace {

// Flat-sequence offsets [runs + 1] int32 on the host: the start of every document of every sample
// in the [bs * sl] token order, then bs * sl. Also the longest run.
std::pair<at::Tensor, int64_t> cumulative_offsets(const DocumentRuns& documents, int64_t sl) {
  int64_t count = 0;
  for (const auto& sample : documents) count += static_cast<int64_t>(sample.size());
  at::Tensor offsets = at::empty({count + 1}, at::TensorOptions(at::kInt));
  int32_t* out = offsets.data_ptr<int32_t>();
  int64_t longest = 0, end = 0;
  for (size_t b = 0; b < documents.size(); ++b) {
    for (const auto& [start, length] : documents[b]) {
      const int64_t flat = static_cast<int64_t>(b) * sl + start;
      TORCH_CHECK(flat == end, "varlen_flash_attention: the runs of sample ", b,
                  " do not cover the sequence in order (run at ", start, ")");
      *out++ = static_cast<int32_t>(flat);
      end = flat + length;
      longest = std::max(longest, length);
    }
  }
  TORCH_CHECK(end == static_cast<int64_t>(documents.size()) * sl,
              "varlen_flash_attention: the runs end at ", end, ", not at bs * sl");
  *out = static_cast<int32_t>(end);
  return {offsets, longest};
}

// q [N, hq, hd], k/v [N, hkv, hd] (N = bs * sl, contiguous), offsets [runs + 1] int32 on q's
// device -> [N, hq, hd]. Saves what the flash backward kernel reads: q, k, v, the output, its
// log-sum-exp and the kernel's RNG state (unused without dropout).
struct VarlenFlashFunction : public torch::autograd::Function<VarlenFlashFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q,
                            const at::Tensor& k, const at::Tensor& v, const at::Tensor& offsets,
                            int64_t longest, double scale) {
    auto [out, logsumexp, rng_state, unused, debug_mask] = at::_flash_attention_forward(
        q, k, v, offsets, offsets, longest, longest, /*dropout_p=*/0.0, /*is_causal=*/true,
        /*return_debug_mask=*/false, std::optional<double>(scale));
    ctx->save_for_backward({q, k, v, out, logsumexp, offsets, rng_state, unused});
    ctx->saved_data["longest"] = longest;
    ctx->saved_data["scale"] = scale;
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const int64_t longest = ctx->saved_data["longest"].toInt();
    const double scale = ctx->saved_data["scale"].toDouble();
    auto [dq, dk, dv] = at::_flash_attention_backward(
        grads[0].contiguous(), saved[0], saved[1], saved[2], saved[3], saved[4], saved[5],
        saved[5], longest, longest, /*dropout_p=*/0.0, /*is_causal=*/true, saved[6], saved[7],
        std::optional<double>(scale));
    return {dq, dk, dv, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// How this LibTorch's varlen kernel lays out its log-sum-exp, learnt from its first forward: older
// releases pad each run to max_q ([n, hq, max_q]), newer ones keep the rows ([hq, total_q]).
enum class LseLayout : int { kUnknown, kRows, kPaddedRuns };
std::atomic<LseLayout> lse_layout{LseLayout::kUnknown};

// A host tensor on `device`: a non-blocking copy from page-locked memory on CUDA.
at::Tensor on_device(const at::Tensor& host, const at::Device& device) {
  return device.is_cuda() ? host.pin_memory().to(device, /*non_blocking=*/true) : host;
}

// The CPU's stand-in for the varlen kernels: SDPA's CPU flash kernel once per run, K/V expanded
// to every query head of their group. Calls visit(q0, nq, k0, nk) for each run: its first query
// row and count, its first key row and count.
template <class Visit>
void for_each_run(const VarlenRuns& runs, Visit&& visit) {
  const int32_t* cu_q = runs.cu_q.data_ptr<int32_t>();
  const int32_t* cu_k = runs.cu_k.data_ptr<int32_t>();
  for (int64_t i = 0; i + 1 < runs.cu_q.size(0); ++i) {
    visit(cu_q[i], cu_q[i + 1] - cu_q[i], cu_k[i], cu_k[i + 1] - cu_k[i]);
  }
}

// [n, h, hd] rows -> [1, h, n, hd] (the CPU kernel's layout), heads repeated `group` times.
at::Tensor heads_first(const at::Tensor& t, int64_t group = 1) {
  const int64_t n = t.size(0), h = t.size(1), hd = t.size(2);
  const at::Tensor heads =
      group == 1 ? t : t.unsqueeze(2).expand({n, h, group, hd}).reshape({n, h * group, hd});
  return heads.transpose(0, 1).unsqueeze(0).contiguous();
}

// The CPU kernel's log-sum-exp dtype for `q`: fp64 for fp64, else fp32.
at::ScalarType cpu_lse_dtype(const at::Tensor& q) {
  return q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

VarlenOutput cpu_runs_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const VarlenRuns& runs, bool causal, double scale) {
  const int64_t hq = q.size(1), group = hq / k.size(1);
  VarlenOutput result{at::empty_like(q),
                      at::empty({hq, q.size(0)}, q.options().dtype(cpu_lse_dtype(q)))};
  for_each_run(runs, [&](int64_t q0, int64_t nq, int64_t k0, int64_t nk) {
    auto [out, lse] = at::_scaled_dot_product_flash_attention_for_cpu(
        heads_first(q.narrow(0, q0, nq)), heads_first(k.narrow(0, k0, nk), group),
        heads_first(v.narrow(0, k0, nk), group), /*dropout_p=*/0.0, causal, {}, scale);
    result.out.narrow(0, q0, nq).copy_(out[0].transpose(0, 1));  // [nq, hq, hd]
    result.lse.narrow(1, q0, nq).copy_(lse[0]);                  // [hq, nq]
  });
  return result;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> cpu_runs_backward(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, const VarlenRuns& runs, bool causal,
    double scale) {
  const int64_t hq = q.size(1), hkv = k.size(1), hd = q.size(2), group = hq / hkv;
  const at::ScalarType sum_dtype = cpu_lse_dtype(q);
  at::Tensor dq = at::zeros_like(q);
  at::Tensor dk = at::zeros(k.sizes(), k.options().dtype(sum_dtype));
  at::Tensor dv = at::zeros(v.sizes(), v.options().dtype(sum_dtype));
  for_each_run(runs, [&](int64_t q0, int64_t nq, int64_t k0, int64_t nk) {
    auto [gq, gk, gv] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
        heads_first(grad_out.narrow(0, q0, nq)), heads_first(q.narrow(0, q0, nq)),
        heads_first(k.narrow(0, k0, nk), group), heads_first(v.narrow(0, k0, nk), group),
        heads_first(out.narrow(0, q0, nq)),
        lse.narrow(1, q0, nq).to(sum_dtype).unsqueeze(0).contiguous(), /*dropout_p=*/0.0, causal,
        {}, scale);
    dq.narrow(0, q0, nq).copy_(gq[0].transpose(0, 1));
    const auto grouped = [&](const at::Tensor& g) {  // [1, hq, nk, hd] -> [nk, hkv, hd]
      return g[0].transpose(0, 1).reshape({nk, hkv, group, hd}).sum(2, false, sum_dtype);
    };
    dk.narrow(0, k0, nk).add_(grouped(gk));
    dv.narrow(0, k0, nk).add_(grouped(gv));
  });
  return {dq, dk.to(k.scalar_type()), dv.to(v.scalar_type())};
}

}  // namespace

VarlenRuns varlen_runs(const std::vector<int32_t>& cu_q, const std::vector<int32_t>& cu_k,
                       const at::Device& device) {
  TORCH_CHECK(
      cu_q.size() == cu_k.size() && cu_q.size() >= 2 && cu_q.front() == 0 && cu_k.front() == 0,
      "varlen_runs: ", cu_q.size(), " query and ", cu_k.size(), " key offsets");
  const int64_t count = static_cast<int64_t>(cu_q.size()) - 1;
  VarlenRuns runs;
  runs.max_q = 2;  // a longest run of 1 would take the kernel's single-query path (other layout)
  for (int64_t i = 0; i < count; ++i) {
    TORCH_CHECK(cu_q[i + 1] > cu_q[i] && cu_k[i + 1] > cu_k[i], "varlen_runs: run ", i,
                " is empty or negative");
    runs.max_q = std::max<int64_t>(runs.max_q, cu_q[i + 1] - cu_q[i]);
    runs.max_k = std::max<int64_t>(runs.max_k, cu_k[i + 1] - cu_k[i]);
  }
  at::Tensor offsets = at::empty({2, count + 1}, at::TensorOptions(at::kInt));  // cu_q; cu_k
  std::copy(cu_q.begin(), cu_q.end(), offsets.data_ptr<int32_t>());
  std::copy(cu_k.begin(), cu_k.end(), offsets.data_ptr<int32_t>() + count + 1);
  at::Tensor slots = at::empty({cu_q.back()}, at::TensorOptions(at::kLong));  // [total_q]
  int64_t* slot = slots.data_ptr<int64_t>();
  for (int64_t i = 0; i < count; ++i) {
    for (int64_t r = cu_q[i]; r < cu_q[i + 1]; ++r) *slot++ = i * runs.max_q + (r - cu_q[i]);
  }
  const at::Tensor device_offsets = on_device(offsets, device);
  runs.cu_q = device_offsets[0];
  runs.cu_k = device_offsets[1];
  runs.lse_slots = on_device(slots, device);
  return runs;
}

VarlenOutput varlen_flash_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const VarlenRuns& runs, bool causal, double scale) {
  TORCH_CHECK(q.size(0) == runs.lse_slots.size(0), "varlen_flash_forward: ", q.size(0),
              " query rows for runs of ", runs.lse_slots.size(0));
  if (q.is_cpu()) return cpu_runs_forward(q, k, v, runs, causal, scale);
  auto [out, lse, rng_state, unused, debug_mask] = at::_flash_attention_forward(
      q, k, v, runs.cu_q, runs.cu_k, runs.max_q, runs.max_k, /*dropout_p=*/0.0, causal,
      /*return_debug_mask=*/false, std::optional<double>(scale));
  const int64_t hq = q.size(1), total_q = q.size(0), count = runs.cu_q.size(0) - 1;
  if (lse.dim() == 2) {
    TORCH_CHECK(lse.size(0) == hq && lse.size(1) == total_q, "varlen_flash_forward: lse ",
                lse.sizes(), " for ", total_q, " rows of ", hq, " heads");
    lse_layout.store(LseLayout::kRows);
    return {out, lse};
  }
  TORCH_CHECK(
      lse.dim() == 3 && lse.size(0) == count && lse.size(1) == hq && lse.size(2) == runs.max_q,
      "varlen_flash_forward: lse ", lse.sizes(), " for ", count, " runs of at most ", runs.max_q,
      " rows, ", hq, " heads");
  lse_layout.store(LseLayout::kPaddedRuns);
  return {out, lse.permute({1, 0, 2})
                   .reshape({hq, count * runs.max_q})
                   .index_select(1, runs.lse_slots)};  // [hq, total_q]
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> varlen_flash_backward(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, const VarlenRuns& runs, bool causal,
    double scale) {
  TORCH_CHECK(q.size(0) == runs.lse_slots.size(0), "varlen_flash_backward: ", q.size(0),
              " query rows for runs of ", runs.lse_slots.size(0));
  if (q.is_cpu()) return cpu_runs_backward(grad_out, q, k, v, out, lse, runs, causal, scale);
  const LseLayout layout = lse_layout.load();
  TORCH_CHECK(layout != LseLayout::kUnknown,
              "varlen_flash_backward: no varlen_flash_forward has run in this process");
  const int64_t hq = q.size(1), count = runs.cu_q.size(0) - 1;
  at::Tensor kernel_lse = lse.to(at::kFloat).contiguous();  // [hq, total_q]
  if (layout == LseLayout::kPaddedRuns) {
    kernel_lse = at::zeros({hq, count * runs.max_q}, kernel_lse.options())
                     .index_copy_(1, runs.lse_slots, kernel_lse)
                     .view({hq, count, runs.max_q})
                     .permute({1, 0, 2})
                     .contiguous();  // [n, hq, max_q]
  }
  const at::Tensor none = at::empty({0}, q.options().dtype(at::kLong));  // no dropout: no RNG
  return at::_flash_attention_backward(grad_out.contiguous(), q, k, v, out.contiguous(), kernel_lse,
                                       runs.cu_q, runs.cu_k, runs.max_q, runs.max_k,
                                       /*dropout_p=*/0.0, causal, none, none,
                                       std::optional<double>(scale));
}

bool varlen_flash_applies(const at::Tensor& q, const at::Tensor& k, const DocumentRuns& documents) {
  const int64_t hd = q.size(3);
  const bool half = q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16;
  return q.is_cuda() && half && hd % 8 == 0 && hd <= 256 && q.size(2) % k.size(2) == 0 &&
         !documents.empty() && static_cast<int64_t>(documents.size()) == q.size(0);
}

at::Tensor varlen_flash_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const DocumentRuns& documents) {
  TORCH_CHECK(varlen_flash_applies(q, k, documents),
              "varlen_flash_attention: needs CUDA fp16/bf16 q with hd % 8 == 0, hd <= 256");
  const int64_t bs = q.size(0), sl = q.size(1), hq = q.size(2), hd = q.size(3), hkv = k.size(2);
  auto [host_offsets, longest] = cumulative_offsets(documents, sl);
  const at::Tensor offsets =
      host_offsets.pin_memory().to(q.device(), /*non_blocking=*/true);  // [runs + 1] int32
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  at::Tensor out = VarlenFlashFunction::apply(
      q.reshape({bs * sl, hq, hd}).contiguous(), k.reshape({bs * sl, hkv, hd}).contiguous(),
      v.reshape({bs * sl, hkv, hd}).contiguous(), offsets, longest, scale);  // [bs * sl, hq, hd]
  return out.view({bs, sl, hq, hd});
}

}  // namespace ulysses::model
