// Packed documents found once on the host: given to sdpa_attention they spare it reading doc_ids
// (doc_ids on the meta device, which has no data, give the same result as real ids), and a
// model forward hands every layer one set of runs, the caller's or its own found once.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "model/attention_core.h"
#include "model/llama.h"
#include "model/sdpa_attention.h"
#include "model_test_util.h"

namespace ulysses::model {
namespace {

// Two samples of 24 tokens: documents of 5, 1, 10, 8 tokens and of 12, 12.
at::Tensor packed_doc_ids() {
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < 24; ++i) ids.push_back(i < 5 ? 0 : i < 6 ? 1 : i < 16 ? 2 : 3);
  for (int64_t i = 0; i < 24; ++i) ids.push_back(i < 12 ? 10 : 11);
  return at::tensor(ids, at::kLong).view({2, 24});  // [bs, sl]
}

// fp32 on CPU, the same kernels on the same inputs: the outputs and gradients are equal, not
// just close; 1e-6 absolute leaves room for nothing but a different summation order.
constexpr double kTolerance = 1e-6;

TEST(HostDocuments, GivenRunsSpareReadingTheDocIds) {
  at::manual_seed(11);
  const at::Tensor doc_ids = packed_doc_ids();
  const DocumentRuns documents = document_runs(doc_ids);
  ASSERT_EQ(documents.size(), 2u);
  // Ids without data: any read of them on the host throws.
  const at::Tensor no_data =
      at::empty({2, 24}, at::TensorOptions().dtype(at::kLong).device(at::kMeta));  // [bs, sl]
  at::Tensor q = at::randn({2, 24, 4, 16}), k = at::randn({2, 24, 2, 16}),
             v = at::randn({2, 24, 2, 16}), grad_out = at::randn({2, 24, 4, 16});
  for (AttentionBackend backend : {AttentionBackend::kSdpaAuto, AttentionBackend::kFlash}) {
    std::vector<at::Tensor> results[2];
    for (int given = 0; given < 2; ++given) {
      at::Tensor qi = q.clone().requires_grad_(), ki = k.clone().requires_grad_(),
                 vi = v.clone().requires_grad_();
      // 0 bytes: always the block-diagonal path.
      at::Tensor out = given ? sdpa_attention(qi, ki, vi, no_data, backend, 0, &documents)
                             : sdpa_attention(qi, ki, vi, doc_ids, backend, 0);
      out.backward(grad_out);
      results[given] = {out.detach(), qi.grad(), ki.grad(), vi.grad()};
    }
    for (size_t i = 0; i < results[0].size(); ++i) {
      EXPECT_TRUE(at::allclose(results[1][i], results[0][i], 0.0, kTolerance))
          << attention_backend_name(backend) << " tensor " << i;
    }
  }
}

// Records the documents each layer's context carries; computes nothing (zeros of q's shape).
class DocumentsCore : public AttentionCore {
 public:
  at::Tensor forward(const at::Tensor& q, const at::Tensor&, const at::Tensor&,
                     const AttentionContext& ctx) override {
    seen.push_back(ctx.documents);
    return q * 0;
  }
  std::string name() const override { return "documents"; }
  std::vector<std::shared_ptr<const DocumentRuns>> seen;
};

TEST(HostDocuments, EveryLayerSharesOneSetOfRuns) {
  config::ModelOptions o = testing::tiny_options();
  o.num_layers = 3;
  LlamaForCausalLM model(o);
  auto core = std::make_shared<DocumentsCore>();
  model->set_attention_core(core);

  // Short: the dense mask serves, nobody needs runs.
  AttentionContext ctx;
  ctx.doc_ids = packed_doc_ids();
  const at::Tensor ids = at::zeros({2, 24}, at::kLong);
  const at::Tensor positions = at::arange(24, at::kLong).repeat({2, 1});  // [bs, sl]
  model->forward_hidden(ids, positions, ctx);
  EXPECT_EQ(core->seen, (std::vector<std::shared_ptr<const DocumentRuns>>(3, nullptr)));

  // The caller's host runs reach every layer as they are.
  core->seen.clear();
  ctx.documents = std::make_shared<const DocumentRuns>(document_runs(ctx.doc_ids));
  model->forward_hidden(ids, positions, ctx);
  EXPECT_EQ(core->seen, (std::vector<std::shared_ptr<const DocumentRuns>>(3, ctx.documents)));

  // Long enough for the block-diagonal path and no host runs: found once, shared by all layers.
  const int64_t sl = 8193;  // 1 * sl * sl bytes of mask > kMaxDenseDocMaskBytes
  AttentionContext long_ctx;
  long_ctx.doc_ids = (at::arange(sl, at::kLong) / 1000).unsqueeze(0);  // [1, sl], 9 documents
  core->seen.clear();
  model->forward_hidden(at::zeros({1, sl}, at::kLong), at::arange(sl, at::kLong).unsqueeze(0),
                        long_ctx);
  ASSERT_EQ(core->seen.size(), 3u);
  ASSERT_NE(core->seen[0], nullptr);
  EXPECT_EQ(core->seen[1], core->seen[0]);
  EXPECT_EQ(core->seen[2], core->seen[0]);
  EXPECT_EQ(*core->seen[0], document_runs(long_ctx.doc_ids));
  EXPECT_EQ(core->seen[0]->at(0).size(), 9u);
}

}  // namespace
}  // namespace ulysses::model
