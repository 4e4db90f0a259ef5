// Packed documents without a [sl, sl] mask: sdpa_attention's block-diagonal path (one causal SDPA
// call per document) against the math backend's masked attention, forward and backward, with GQA;
// document_runs on contiguous and non-contiguous ids.
#include <gtest/gtest.h>

#include "model/attention_core.h"
#include "model/sdpa_attention.h"

namespace ulysses::model {
namespace {

using Runs = std::vector<std::vector<std::pair<int64_t, int64_t>>>;

TEST(DocumentRuns, ContiguousIdsGiveOneRunPerDocument) {
  at::Tensor ids = at::tensor({0, 0, 0, 1, 1, 2, 2, 2, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5},
                              at::kLong)
                       .view({2, 9});  // [bs 2, sl 9]
  EXPECT_EQ(document_runs(ids), (Runs{{{0, 3}, {3, 2}, {5, 3}, {8, 1}}, {{0, 9}}}));
}

TEST(DocumentRuns, AnIdThatReturnsNeedsTheMask) {
  at::Tensor ids = at::tensor({0, 0, 1, 1, 0, 0}, at::kLong).view({1, 6});
  EXPECT_TRUE(document_runs(ids).empty());
}

// q/k/v and output gradients with fixed seeds; GQA (hq 4, hkv 2).
struct Inputs {
  at::Tensor q, k, v, grad_out;  // [bs, sl, hq|hkv, hd]
};
Inputs make_inputs(int64_t bs, int64_t sl) {
  at::manual_seed(7);
  Inputs in;
  in.q = at::randn({bs, sl, 4, 16});
  in.k = at::randn({bs, sl, 2, 16});
  in.v = at::randn({bs, sl, 2, 16});
  in.grad_out = at::randn({bs, sl, 4, 16});
  return in;
}

// Output and q/k/v gradients of one backend (max_dense_mask_bytes only for SDPA backends).
std::vector<at::Tensor> run(const Inputs& in, const at::Tensor& doc_ids, AttentionBackend backend,
                            int64_t max_dense_mask_bytes) {
  at::Tensor q = in.q.clone().requires_grad_(true), k = in.k.clone().requires_grad_(true),
             v = in.v.clone().requires_grad_(true);
  at::Tensor out = backend == AttentionBackend::kMath
                       ? local_attention(q, k, v, doc_ids, backend)
                       : sdpa_attention(q, k, v, doc_ids, backend, max_dense_mask_bytes);
  out.backward(in.grad_out);
  return {out.detach(), q.grad(), k.grad(), v.grad()};
}

// fp32 on CPU: both paths compute the same softmax over the same keys in different kernels;
// 1e-5 absolute covers their rounding (values and gradients are O(1)).
constexpr double kTolerance = 1e-5;

TEST(DocumentBlocks, BlockDiagonalEqualsTheMaskedMath) {
  const int64_t bs = 2, sl = 24;
  Inputs in = make_inputs(bs, sl);
  // Sample 0: documents of 5, 1, 10, 8 tokens; sample 1: 12, 12.
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < sl; ++i) ids.push_back(i < 5 ? 0 : i < 6 ? 1 : i < 16 ? 2 : 3);
  for (int64_t i = 0; i < sl; ++i) ids.push_back(i < 12 ? 10 : 11);
  at::Tensor doc_ids = at::tensor(ids, at::kLong).view({bs, sl});  // [bs, sl]
  ASSERT_EQ(document_runs(doc_ids).size(), 2u);

  std::vector<at::Tensor> want = run(in, doc_ids, AttentionBackend::kMath, 0);
  for (AttentionBackend backend : {AttentionBackend::kSdpaAuto, AttentionBackend::kFlash}) {
    // 0 bytes: always the block-diagonal path; the default: the dense mask (24 * 24 * 2 bytes).
    for (int64_t max_bytes : {int64_t{0}, kMaxDenseDocMaskBytes}) {
      std::vector<at::Tensor> got = run(in, doc_ids, backend, max_bytes);
      const char* names[] = {"out", "grad q", "grad k", "grad v"};
      for (size_t i = 0; i < want.size(); ++i) {
        EXPECT_TRUE(at::allclose(got[i], want[i], 0.0, kTolerance))
            << names[i] << " backend " << attention_backend_name(backend) << " max_bytes "
            << max_bytes << " max diff " << (got[i] - want[i]).abs().max().item<double>();
      }
    }
  }
}

TEST(DocumentBlocks, ReturningIdFallsBackToTheMask) {
  const int64_t sl = 12;
  Inputs in = make_inputs(1, sl);
  at::Tensor doc_ids = at::tensor({0, 0, 0, 1, 1, 1, 0, 0, 0, 2, 2, 2}, at::kLong).view({1, sl});
  std::vector<at::Tensor> want = run(in, doc_ids, AttentionBackend::kMath, 0);
  std::vector<at::Tensor> got = run(in, doc_ids, AttentionBackend::kSdpaAuto, 0);
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_TRUE(at::allclose(got[i], want[i], 0.0, kTolerance)) << i;
  }
}

}  // namespace
}  // namespace ulysses::model
