// Packed documents through one varlen flash launch: on CUDA (bf16) forward and every input
// gradient equal one SDPA call per document and the masked math reference; on CPU the path never
// applies (the per-document SDPA calls run, as the DocumentBlocks tests check).
#include <gtest/gtest.h>

#include <torch/cuda.h>

#include <algorithm>
#include <functional>

#include "common/document_runs.h"
#include "model/attention_core.h"
#include "model/sdpa_attention.h"
#include "model/varlen_flash_attention.h"

namespace ulysses::model {
namespace {

// doc_ids [bs, sl] of documents of the given lengths per sample (each sample sums to sl).
at::Tensor doc_ids_of(const std::vector<std::vector<int64_t>>& lengths, int64_t sl) {
  at::Tensor ids = at::empty({static_cast<int64_t>(lengths.size()), sl}, at::kLong);
  for (size_t b = 0; b < lengths.size(); ++b) {
    int64_t position = 0, id = 0;
    for (int64_t length : lengths[b]) {
      ids[static_cast<int64_t>(b)].narrow(0, position, length).fill_(id++);
      position += length;
    }
  }
  return ids;
}

TEST(VarlenFlash, NeverAppliesOnCpuOrInFp32) {
  const at::Tensor q = at::randn({1, 16, 4, 8}), k = at::randn({1, 16, 2, 8});
  const DocumentRuns runs = document_runs(doc_ids_of({{5, 11}}, 16));
  EXPECT_FALSE(varlen_flash_applies(q, k, runs));
  EXPECT_FALSE(varlen_flash_applies(q.to(at::kBFloat16), k.to(at::kBFloat16), runs));
  EXPECT_FALSE(varlen_flash_applies(q, k, DocumentRuns{}));
}

// Runs on a CUDA machine only (the GPU campaign's ctest): the varlen kernel against one SDPA call
// per document (the same flash kernel, so bf16 rounding is alike: 2e-2 relative covers bf16's
// 8-bit mantissa over sums of 16-64 terms) and against the masked math path in fp32.
TEST(VarlenFlash, EqualsOneCallPerDocumentOnCuda) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs a CUDA device";
  at::manual_seed(11);
  const int64_t sl = 96, hq = 8, hkv = 2, hd = 64;
  const at::Tensor doc_ids = doc_ids_of({{7, 41, 1, 47}, {96}}, sl).cuda();  // [2, 96]
  const DocumentRuns runs = document_runs(doc_ids);
  const auto options = at::TensorOptions(at::kBFloat16).device(at::kCUDA);
  const at::Tensor q0 = at::randn({2, sl, hq, hd}, options);
  const at::Tensor k0 = at::randn({2, sl, hkv, hd}, options);
  const at::Tensor v0 = at::randn({2, sl, hkv, hd}, options);
  const at::Tensor grad = at::randn({2, sl, hq, hd}, options);
  ASSERT_TRUE(varlen_flash_applies(q0, k0, runs));

  // out, dq, dk, dv of one path
  using Attend = std::function<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&)>;
  auto run = [&](const Attend& attend) {
    at::Tensor q = q0.clone().requires_grad_(true), k = k0.clone().requires_grad_(true),
               v = v0.clone().requires_grad_(true);
    at::Tensor out = attend(q, k, v);
    out.backward(grad);
    return std::vector<at::Tensor>{out.detach().to(at::kFloat), q.grad().to(at::kFloat),
                                   k.grad().to(at::kFloat), v.grad().to(at::kFloat)};
  };
  const auto varlen = run([&](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
    return sdpa_attention(q, k, v, doc_ids, AttentionBackend::kFlash, /*max_dense_mask_bytes=*/0,
                          &runs);
  });
  const std::vector<std::string> used = attention_kernels_used();
  EXPECT_NE(std::find(used.begin(), used.end(), "flash_varlen"), used.end());
  const auto per_document = run([&](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
    std::vector<at::Tensor> samples;
    for (int64_t b = 0; b < 2; ++b) {
      std::vector<at::Tensor> pieces;
      for (const auto& [start, length] : runs[static_cast<size_t>(b)]) {
        auto slice = [&](const at::Tensor& t) {
          return t.narrow(0, b, 1).narrow(1, start, length);
        };
        pieces.push_back(sdpa_attention(slice(q), slice(k), slice(v), at::Tensor(),
                                        AttentionBackend::kFlash));
      }
      samples.push_back(at::cat(pieces, 1));
    }
    return at::cat(samples, 0);
  });
  const auto math = run([&](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
    return local_attention(q.to(at::kFloat), k.to(at::kFloat), v.to(at::kFloat), doc_ids,
                           AttentionBackend::kMath);
  });
  const char* names[] = {"out", "dq", "dk", "dv"};
  for (size_t i = 0; i < 4; ++i) {
    SCOPED_TRACE(names[i]);
    const double scale = per_document[i].abs().max().item<double>();
    EXPECT_LT((varlen[i] - per_document[i]).abs().max().item<double>(), 2e-2 * scale);
    EXPECT_LT((varlen[i] - math[i]).abs().max().item<double>(), 3e-2 * scale);
  }
}

}  // namespace
}  // namespace ulysses::model
