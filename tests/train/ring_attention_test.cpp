// Ring attention (mesh.sp_ring) on real Gloo ranks.
// - The kernel alone, in fp64: each ring rank's output and q/k/v gradients for its zig-zag block
//   equal plain ATen causal attention over the whole sequence (scores, mask, softmax, written here
//   without project code) within 1e-10, for rings of 2, 3 and 4 ranks, GQA, and packed documents
//   whose boundaries fall inside and across blocks; through the math path and through SDPA's CPU
//   flash kernel (packed pairs per shared document, as the varlen kernel runs them on CUDA; no
//   scores materialised). With a score budget of a few query rows (packed documents mostly shorter
//   than a chunk, fp32 and fp64), the math path holds no block larger than [bs, hq, rows, C]
//   (never [C, C]) and still equals the reference (fp32 within 2e-5).
// - On a GPU only: packed bf16 through the flash and varlen kernels and through the math path.
// - Whole 3-step runs: loss and grad_norm every step and the final weights of sp 4 = 2 x 2,
//   sp 8 = 2 x 4 with 4 query heads (sp > heads), and dp 2 x (2 x 2) with tiled MLP,
//   checkpointing, the offloaded optimizer and ZeRO-3, equal the single process within the
//   equivalence tolerances (fp32: relative 1e-5 on the loss, 1e-4 on grad_norm; 5e-4 on each final
//   weight, see kWeightRelTol), as the all-to-all alone at sp 4 does.
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "comm/mesh.h"
#include "data/sequence_layout.h"
#include "model/safetensors.h"
#include "run_outputs.h"
#include "model/attention_core.h"
#include "sp/ring_attention.h"
#include "support/multi_rank.h"
#include "train/trainer.h"
#include "train_test_util.h"

namespace ulysses {
namespace {

constexpr double kFp64Tol = 1e-10;    // fp64 kernel against fp64 plain attention
constexpr double kFp32Tol = 2e-5;     // fp32 kernel against fp64 plain attention (inputs in fp32)
constexpr double kLossRelTol = 1e-5;  // the equivalence tolerances (fp32)
constexpr double kGradRelTol = 1e-4;
// Final weights after 3 AdamW steps: m / sqrt(v) divides each element by its own gradient's size,
// so elements whose gradients are near zero carry the fp32 rounding of a different reduction order
// into the weights. The all-to-all alone (sp 4, no ring, the `a2a4_1x4` run) moves them by 7e-5 of
// their norm here; a wrong block or a lost gradient moves them by more than 1e-2.
constexpr double kWeightRelTol = 5e-4;

// Plain causal attention in fp64 over [bs, P, h, hd] (GQA by grouping), documents separate when
// doc_ids [bs, P] is defined.
at::Tensor plain_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& doc_ids) {
  const int64_t length = q.size(1), group = q.size(2) / k.size(2);
  const at::Tensor qh = q.transpose(1, 2);                                   // [bs, hq, P, hd]
  const at::Tensor kh = k.repeat_interleave(group, 2).transpose(1, 2);       // [bs, hq, P, hd]
  const at::Tensor vh = v.repeat_interleave(group, 2).transpose(1, 2);
  at::Tensor scores = at::matmul(qh, kh.transpose(-1, -2)) / std::sqrt(double(q.size(3)));
  at::Tensor allowed = at::ones({length, length}, at::kBool).tril().unsqueeze(0);  // [1, P, P]
  if (doc_ids.defined()) allowed = allowed & doc_ids.unsqueeze(2).eq(doc_ids.unsqueeze(1));
  scores = scores.masked_fill(allowed.unsqueeze(1).logical_not(),
                              -std::numeric_limits<double>::infinity());
  return at::matmul(at::softmax(scores, -1), vh).transpose(1, 2);  // [bs, P, hq, hd]
}

struct KernelCase {
  std::string name;
  int64_t ring, hq, hkv;
  bool packed;
  bool fused = false;  // SDPA's CPU flash kernel per pair of chunks
  at::ScalarType dtype = at::kDouble;
  int64_t chunk = 5;      // C
  int64_t tile_rows = 0;  // > 0: a score budget of this many query rows (< C), checked
};
void PrintTo(const KernelCase& kc, std::ostream* os) { *os << kc.name; }

class RingKernel : public ::testing::TestWithParam<KernelCase> {};

TEST_P(RingKernel, BlocksEqualPlainAttentionOverTheWholeSequence) {
  const KernelCase kc = GetParam();
  testing::run_ranks(static_cast<int>(kc.ring), [&](const testing::RankContext& ctx) {
    constexpr int64_t kBs = 2, kHd = 8;
    const int64_t chunk = kc.chunk, length = 2 * kc.ring * chunk;
    const auto f64 = at::TensorOptions().dtype(at::kDouble);
    at::manual_seed(11);  // the same tensors on every rank
    // The kernel's inputs in kc.dtype; the reference takes the same values in fp64.
    const auto input = [&](int64_t heads) {
      return at::randn({kBs, length, heads, kHd}, f64).to(kc.dtype).to(at::kDouble);
    };
    const at::Tensor q = input(kc.hq), k = input(kc.hkv), v = input(kc.hkv);
    const at::Tensor grad_out = at::randn({kBs, length, kc.hq, kHd}, f64);
    at::Tensor doc_ids;
    if (kc.packed) {  // documents of 3, 9, 1, 14, ... positions: boundaries inside and across
      std::vector<int64_t> ids;
      const std::vector<int64_t> lengths = {3, 9, 1, 14, 6, 2, 11, 7, 4, 13};
      for (int64_t doc = 0; static_cast<int64_t>(ids.size()) < length; ++doc) {
        for (int64_t i = 0; i < lengths[doc % lengths.size()]; ++i) ids.push_back(doc);
      }
      ids.resize(length);
      const at::Tensor row = at::tensor(ids, at::TensorOptions().dtype(at::kLong));
      doc_ids = at::stack({row, (row + 1).div(2, "floor")});  // two samples, different cuts
    }
    // The fused cases take the documents as the batch brings them (found on the host); the others
    // let the kernel find them.
    const DocumentRuns runs = doc_ids.defined() ? document_runs(doc_ids) : DocumentRuns{};
    // The reference over the whole sequence.
    const at::Tensor rq = q.clone().requires_grad_(), rk = k.clone().requires_grad_(),
                     rv = v.clone().requires_grad_();
    const at::Tensor want = plain_attention(rq, rk, rv, doc_ids);
    want.backward(grad_out);

    // This rank's zig-zag block through the ring.
    auto mesh = comm::DeviceMesh::create_for_test(ctx.rank, ctx.world, ctx.store_path, 1, kc.ring,
                                                  60.0, at::Device(at::kCPU), kc.ring);
    const at::Tensor mine = data::shard_positions(length, kc.ring, kc.ring, ctx.rank);  // [2C]
    const auto block = [&](const at::Tensor& t) {
      return t.index_select(1, mine).to(kc.dtype).requires_grad_();
    };
    const at::Tensor bq = block(q), bk = block(k), bv = block(v);
    sp::RingOptions options;
    options.backend =
        kc.fused ? model::AttentionBackend::kSdpaAuto : model::AttentionBackend::kMath;
    // One query row of scores: [bs, hq, 1, C] in the compute dtype (the input's here).
    const int64_t row_elements = kBs * kc.hq * chunk;
    if (kc.tile_rows > 0) {
      options.score_block_bytes =
          kc.tile_rows * row_elements * static_cast<int64_t>(c10::elementSize(kc.dtype));
    }
    sp::RingStats stats;
    options.stats = &stats;
    const at::Tensor got = sp::ring_attention(bq, bk, bv, doc_ids, kc.fused ? &runs : nullptr,
                                              mesh.sp_ring(), options);
    const int64_t forward_block = stats.largest_score_block;  // before the backward adds its own
    got.backward(grad_out.index_select(1, mine).to(kc.dtype));

    if (kc.fused) {  // every pair through a flash kernel (documents as runs): no scores at all
      EXPECT_EQ(stats.largest_score_block, 0) << kc.name << " rank " << ctx.rank;
    } else {
      EXPECT_GT(forward_block, 0) << kc.name << " rank " << ctx.rank;
    }
    if (kc.tile_rows > 0) {
      // Every score block the math path held, forward and backward, is one tile of query rows
      // against the key chunk; a [C, C] block (all rows at once) would be chunk / tile_rows
      // times larger.
      EXPECT_LE(stats.largest_score_block, kc.tile_rows * row_elements)
          << kc.name << " rank " << ctx.rank;
      EXPECT_LT(stats.largest_score_block, chunk * row_elements) << kc.name << " rank " << ctx.rank;
    }
    const double tolerance = kc.dtype == at::kDouble ? kFp64Tol : kFp32Tol;
    const auto check = [&](const char* what, const at::Tensor& a, const at::Tensor& b) {
      const double err = (a.to(at::kDouble) - b).abs().max().item<double>();
      EXPECT_LT(err, tolerance) << kc.name << " " << what << " rank " << ctx.rank;
      EXPECT_GT(b.abs().max().item<double>(), 0.1) << what;  // not trivially zero
    };
    check("out", got, want.index_select(1, mine));
    check("dq", bq.grad(), rq.grad().index_select(1, mine));
    check("dk", bk.grad(), rk.grad().index_select(1, mine));
    check("dv", bv.grad(), rv.grad().index_select(1, mine));
  });
}

INSTANTIATE_TEST_SUITE_P(Rings, RingKernel,
                         ::testing::Values(KernelCase{"ring2_gqa", 2, 4, 2, false},
                                           KernelCase{"ring3_mqa", 3, 3, 1, false},
                                           KernelCase{"ring4_mha", 4, 2, 2, false},
                                           KernelCase{"ring2_packed", 2, 4, 2, true},
                                           KernelCase{"ring4_packed_gqa", 4, 4, 2, true},
                                           KernelCase{"ring2_gqa_fused", 2, 4, 2, false, true},
                                           KernelCase{"ring3_mqa_fused", 3, 3, 1, false, true},
                                           // Pairs inside one document run fused, the others
                                           // through the varlen path (on CPU one flash call
                                           // per document the two chunks share).
                                           KernelCase{"ring2_packed_fused", 2, 4, 2, true, true},
                                           KernelCase{"ring3_packed_fp32_fused", 3, 4, 2, true,
                                                      true, at::kFloat, 12},
                                           // The math path in blocks of 5 query rows (C = 12,
                                           // most documents shorter than a chunk).
                                           KernelCase{"ring2_packed_fp32_tiled", 2, 4, 2, true,
                                                      false, at::kFloat, 12, 5},
                                           KernelCase{"ring3_packed_mqa_tiled", 3, 4, 1, true,
                                                      false, at::kDouble, 12, 5}),
                         [](const ::testing::TestParamInfo<KernelCase>& info) {
                           return info.param.name;
                         });

// On a GPU (skipped without one): a ring of one rank holds chunks 0 and 1, so its pairs are both
// kinds, diagonal and full. bf16 documents shorter and longer than a chunk (packed), and the same
// tensors without documents (causal only), through the flash kernels (attention.backend flash:
// the varlen kernel for the packed pairs, SDPA's flash kernel for the others; no scores
// materialised) and through the math path in blocks of 16 query rows (attention.backend efficient,
// which the ring does not call flash for), equal fp64 plain attention within bf16's precision:
// relative 3e-2 of each tensor's largest element. Below compute capability 8.0 flash does not
// run and every pair takes the math path, which the test then expects.
// It sits in the RingAttentionRun suite, so that where it is skipped it costs no process start.
TEST(RingAttentionRun, GpuKernelPackedBf16EqualsPlainAttention) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs a CUDA device";
  constexpr int64_t kBs = 2, kChunk = 64, kHq = 4, kHkv = 2, kHd = 64, kTileRows = 16;
  constexpr double kBf16RelTol = 3e-2;
  const int64_t length = 2 * kChunk;
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  at::manual_seed(11);
  const auto input = [&](int64_t heads) {  // bf16 values, held in fp64 for the reference
    return at::randn({kBs, length, heads, kHd}, f64).to(at::kBFloat16).to(at::kDouble);
  };
  const at::Tensor q = input(kHq), k = input(kHkv), v = input(kHkv), grad_out = input(kHq);
  std::vector<int64_t> ids;
  const std::vector<int64_t> lengths = {5, 40, 3, 70, 10};
  for (int64_t doc = 0; static_cast<int64_t>(ids.size()) < length; ++doc) {
    ids.insert(ids.end(), lengths[doc % lengths.size()], doc);
  }
  ids.resize(length);
  const at::Tensor row = at::tensor(ids, at::TensorOptions().dtype(at::kLong));
  const at::Tensor packed_ids = at::stack({row, (row + 1).div(2, "floor")});
  const DocumentRuns packed_runs = document_runs(packed_ids);
  const auto on_gpu = [](const at::Tensor& t) {
    return t.to(at::kCUDA, at::kBFloat16).requires_grad_();
  };
  const bool flash_runs = sp::cuda_flash_runs(on_gpu(q));

  comm::Group single;  // a ring of one rank
  for (const bool packed : {true, false}) {
    const at::Tensor doc_ids = packed ? packed_ids : at::Tensor();
    const DocumentRuns* runs = packed ? &packed_runs : nullptr;
    const at::Tensor rq = q.clone().requires_grad_(), rk = k.clone().requires_grad_(),
                     rv = v.clone().requires_grad_();
    const at::Tensor want = plain_attention(rq, rk, rv, doc_ids);
    want.backward(grad_out);
    for (const auto backend :
         {model::AttentionBackend::kFlash, model::AttentionBackend::kEfficient}) {
      const std::string name = model::attention_backend_name(backend) +
                               (packed ? " packed" : " causal");
      const at::Tensor bq = on_gpu(q), bk = on_gpu(k), bv = on_gpu(v);
      sp::RingOptions options;
      options.backend = backend;
      options.score_block_bytes = kTileRows * kBs * kHq * kChunk * 4;  // fp32 scores
      sp::RingStats stats;
      options.stats = &stats;
      const at::Tensor got = sp::ring_attention(
          bq, bk, bv, packed ? doc_ids.to(at::kCUDA) : doc_ids, runs, single, options);
      got.backward(grad_out.to(at::kCUDA, at::kBFloat16));
      if (backend == model::AttentionBackend::kFlash && flash_runs) {
        EXPECT_EQ(stats.largest_score_block, 0) << name;
        const std::vector<std::string> kernels = model::attention_kernels_used();
        const std::string kernel = packed ? "ring_flash_varlen" : "ring_flash";
        EXPECT_NE(std::find(kernels.begin(), kernels.end(), kernel), kernels.end()) << name;
      } else {
        EXPECT_GT(stats.largest_score_block, 0) << name;
        EXPECT_LE(stats.largest_score_block, kBs * kHq * kTileRows * kChunk) << name;
      }
      const auto check = [&](const char* what, const at::Tensor& a, const at::Tensor& b) {
        const double scale = b.abs().max().item<double>();
        const double err = (a.cpu().to(at::kDouble) - b).abs().max().item<double>();
        EXPECT_LT(err, kBf16RelTol * scale) << name << " " << what;
        EXPECT_GT(scale, 0.1) << what;  // not trivially zero
      };
      check("out", got, want);
      check("dq", bq.grad(), rq.grad());
      check("dk", bk.grad(), rk.grad());
      check("dv", bv.grad(), rv.grad());
    }
  }
}

struct RunCase {
  std::string name;
  int64_t dp, sp, ring;
  bool memory_features = false;  // tiled MLP, checkpointing, offloaded optimizer, ZeRO-3
  bool packed = false;
};

// 3 steps of AdamW with clipping from the same init: loss and grad_norm per step and the final
// weights of each ring mesh equal the single-process run (hq 4, hkv 2).
TEST(RingAttentionRun, ThreeStepsEqualSingleProcess) {
  const std::string dir = testing::shared_dir("ring-attention-test", "run");
  constexpr int64_t kSteps = 3;
  const std::vector<RunCase> runs = {
      {"1x1", 1, 1, 1},
      {"a2a2_x2_1x4", 1, 4, 2},
      {"a2a4_1x4", 1, 4, 1},
      {"a2a2_x4_1x8", 1, 8, 4},
      {"a2a2_x2_2x4_tiles_ckpt_offload_zero3", 2, 4, 2, true},
      {"packed_1x1", 1, 1, 1, false, true},
      {"packed_a2a2_x2_1x4", 1, 4, 2, false, true},
  };
  const auto out_dir = [&](const RunCase& rc) { return dir + "/" + rc.name; };
  for (const RunCase& rc : runs) {
    config::RunConfig c = testing::tiny_run_config(4, 2, rc.dp, rc.sp);
    c.mesh.sp_ring.value = rc.ring;
    c.model.init_std = 0.05;
    c.sequence.micro_batch = 2 / rc.dp;  // the same global batch of 2 samples on every mesh
    c.data.pack = rc.packed;
    c.optim.lr = 1e-2;
    c.optim.grad_clip = 1.0;
    c.train.steps = kSteps;
    c.profile.warmup_steps = 0;
    if (rc.memory_features) {
      c.memory.tiled_mlp.value = 2;
      c.memory.checkpointing = true;
      c.memory.offload_optimizer = true;
      c.zero.stage = 3;
    }
    c.output.dir = out_dir(rc);
    c.checkpoint.dir = out_dir(rc) + "/ckpt";
    testing::train_on_ranks(c);
  }
  if (testing::in_rank_child()) return;

  const std::string last = "/ckpt/step-" + std::to_string(kSteps) + "/model.safetensors";
  for (const RunCase& rc : runs) {
    if (rc.sp == 1) continue;
    const RunCase& base = rc.packed ? runs[5] : runs[0];
    const std::vector<testing::StepRecord> steps =
        testing::read_steps(out_dir(rc) + "/metrics.jsonl");
    const std::vector<testing::StepRecord> base_steps =
        testing::read_steps(out_dir(base) + "/metrics.jsonl");
    ASSERT_EQ(steps.size(), static_cast<size_t>(kSteps)) << rc.name;
    ASSERT_EQ(base_steps.size(), static_cast<size_t>(kSteps)) << base.name;
    EXPECT_GT(base_steps[0].grad_norm, 1.0) << "clipping should be active on step 1";
    const testing::StepsDiff worst =
        testing::expect_steps_match(steps, base_steps, kLossRelTol, kGradRelTol, rc.name);
    double worst_weight = 0;
    const auto weights = model::load_safetensors(out_dir(rc) + last);
    const auto base_weights = model::load_safetensors(out_dir(base) + last);
    ASSERT_EQ(weights.size(), base_weights.size()) << rc.name;
    for (const auto& [name, w] : base_weights) {
      const double err = testing::relative_error(weights.at(name), w);
      EXPECT_LT(err, kWeightRelTol) << rc.name << ": " << name;
      worst_weight = std::max(worst_weight, err);
    }
    std::printf("%s vs %s over %lld steps: loss rel err %.2g, grad_norm %.2g, final weights %.2g\n",
                rc.name.c_str(), base.name.c_str(), static_cast<long long>(kSteps), worst.loss,
                worst.grad_norm, worst_weight);
  }
  ulysses::remove_tree(dir);
}

}  // namespace
}  // namespace ulysses
