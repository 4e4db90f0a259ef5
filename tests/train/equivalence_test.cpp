// Loss and every parameter gradient over any dp x sp mesh equal one process running the
// same global batch without SP (fp32: relative 1e-5 on the loss, 1e-4 on each gradient), for Llama
// and for the Qwen2 (q/k/v biases) and Qwen3 (q/k norms, hq * hd != h) families.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "comm/mesh.h"
#include "data/data_loader.h"
#include "support/multi_rank.h"
#include "zero/gradient_step.h"
#include "train/trainer.h"
#include "train_test_util.h"

namespace ulysses {
namespace {

constexpr double kLossRelTol = 1e-5;  // the equivalence tolerance (fp32)
constexpr double kGradRelTol = 1e-4;  // per parameter tensor (relative L2)

struct MeshCase {
  std::string name;
  int64_t dp, sp, hq, hkv;
  int64_t length = 24;  // padded to a multiple of sp when not divisible
  int64_t micro_batch = 1, grad_accum = 1;
  bool pack = false;
  // model.family; other than llama: testing::set_family's shapes, 1-D parameters perturbed
  std::string family = "llama";
};

// The family's tiny model (hq 4, hkv 2, h 32) on a dp x sp mesh: at sp 4 each KV head sits on 2
// ranks (replication) and each rank holds one query head (sp == hq).
MeshCase family_case(const std::string& family, int64_t dp, int64_t sp) {
  MeshCase mc{family + "_" + std::to_string(dp) + "x" + std::to_string(sp), dp, sp, 4, 2};
  mc.family = family;
  return mc;
}

std::vector<data::Batch> rank_batches(const config::RunConfig& c, int64_t dp, int64_t dp_rank,
                                      int64_t sp, int64_t sp_rank) {
  data::DataLoader loader(c.data, c.sequence, c.model.vocab_size, dp, dp_rank, sp, sp_rank);
  std::vector<data::Batch> out;
  for (int64_t m = 0; m < c.sequence.grad_accum; ++m) out.push_back(loader.micro_batch(1, m));
  return out;
}

class Equivalence : public ::testing::TestWithParam<MeshCase> {};

TEST_P(Equivalence, LossAndGradientsMatchSingleProcess) {
  const MeshCase mc = GetParam();
  testing::run_ranks(static_cast<int>(mc.dp * mc.sp), [&](const testing::RankContext& ctx) {
    config::RunConfig c = testing::tiny_run_config(mc.hq, mc.hkv, mc.dp, mc.sp);
    c.sequence.length = mc.length;
    c.sequence.micro_batch = mc.micro_batch;
    c.sequence.grad_accum = mc.grad_accum;
    c.data.pack = mc.pack;
    testing::set_family(c.model, mc.family);
    const bool perturb = mc.family != "llama";
    const at::Device cpu(at::kCPU);

    auto mesh = comm::DeviceMesh::create_for_test(ctx.rank, ctx.world, ctx.store_path, mc.dp, mc.sp);
    model::LlamaForCausalLM model = train::build_model(c, mesh, cpu);
    if (perturb) testing::perturb_vector_parameters(*model);
    auto batches = rank_batches(c, mc.dp, mesh.dp_rank(), mc.sp, mesh.sp_rank());
    train::StepLoss got = train::compute_gradients(model, batches, mesh);

    // Reference: this process alone, whole global batch in one micro-batch, no SP.
    config::RunConfig ref_c = c;
    ref_c.mesh.dp = 1;
    ref_c.mesh.sp = 1;
    ref_c.sequence.micro_batch = mc.dp * mc.micro_batch * mc.grad_accum;
    ref_c.sequence.grad_accum = 1;
    auto ref_mesh = comm::DeviceMesh::create_for_test(
        0, 1, ctx.temp_dir + "/ref-store-" + std::to_string(ctx.rank), 1, 1);
    model::LlamaForCausalLM ref_model = train::build_model(ref_c, ref_mesh, cpu);
    if (perturb) testing::perturb_vector_parameters(*ref_model);
    train::StepLoss want = train::compute_gradients(ref_model, rank_batches(ref_c, 1, 0, 1, 0), ref_mesh);

    EXPECT_EQ(got.valid_tokens, want.valid_tokens);
    EXPECT_NEAR(got.loss, want.loss, kLossRelTol * std::abs(want.loss)) << mc.name;
    auto params = model->named_parameters();
    auto ref_params = ref_model->named_parameters();
    ASSERT_EQ(params.size(), ref_params.size());
    double worst = 0.0;
    std::string worst_name;
    for (const auto& item : ref_params) {
      const at::Tensor& g = params[item.key()].grad();
      ASSERT_TRUE(g.defined()) << item.key();
      const double err = testing::relative_error(g, item.value().grad());
      EXPECT_LT(err, kGradRelTol) << mc.name << " " << item.key() << " rank " << ctx.rank;
      if (err > worst) {
        worst = err;
        worst_name = item.key();
      }
      // The family's own parameters (biases, q/k norms) must get a gradient that is not zero.
      if (perturb) {
        EXPECT_GT(item.value().grad().norm().item<double>(), 0) << item.key();
      }
    }
    if (ctx.rank == 0) {
      std::printf("%s: loss rel err %.3g, worst gradient rel err %.3g (%s)\n", mc.name.c_str(),
                  std::abs(got.loss - want.loss) / want.loss, worst, worst_name.c_str());
    }
    // A gradient that is all zeros would match trivially: make sure it is not.
    EXPECT_GT(ref_params["model.layers.0.self_attn.q_proj.weight"].grad().norm().item<double>(), 0);
  });
}

INSTANTIATE_TEST_SUITE_P(
    Meshes, Equivalence,
    ::testing::Values(MeshCase{"1x1", 1, 1, 4, 2}, MeshCase{"1x2", 1, 2, 4, 2},
                      MeshCase{"1x4", 1, 4, 8, 4}, MeshCase{"2x1", 2, 1, 4, 2},
                      MeshCase{"2x2", 2, 2, 4, 2}, MeshCase{"4x1", 4, 1, 4, 2},
                      // GQA replication: hq 8, hkv 2, sp 4 -> each KV head on 2 ranks
                      MeshCase{"gqa_replicate_1x4", 1, 4, 8, 2},
                      MeshCase{"mqa_1x4", 1, 4, 4, 1}, MeshCase{"mha_1x2", 1, 2, 4, 4},
                      // 22 tokens over sp 4: padded to 24, last shard holds fewer valid labels
                      MeshCase{"padding_1x4", 1, 4, 4, 2, 22},
                      MeshCase{"packed_2x2", 2, 2, 4, 2, 24, 1, 1, true},
                      MeshCase{"accum_bs2_2x2", 2, 2, 4, 2, 20, 2, 2, false},
                      // The families: Qwen2's biases, Qwen3's q/k norms with hq * hd = 2 h
                      family_case("qwen2", 1, 1), family_case("qwen2", 1, 2),
                      family_case("qwen2", 1, 4), family_case("qwen2", 2, 1),
                      family_case("qwen2", 2, 2), family_case("qwen3", 1, 1),
                      family_case("qwen3", 1, 2), family_case("qwen3", 1, 4),
                      family_case("qwen3", 2, 1), family_case("qwen3", 2, 2)),
    [](const ::testing::TestParamInfo<MeshCase>& info) { return info.param.name; });

}  // namespace
}  // namespace ulysses
