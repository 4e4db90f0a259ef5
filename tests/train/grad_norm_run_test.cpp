// Whole training runs on real Gloo ranks report the same grad_norm per step for sp = 1, 2, 4 (and
// dp 2 x sp 2). Losses alone cannot show an sp-times gradient factor: clipping to grad_clip and
// AdamW's m / sqrt(v) both cancel a constant scale, so the loss curves agree while the gradients
// are wrong. grad_norm (before clipping, as metrics.jsonl reports it) shows it.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "comm/mesh.h"
#include "support/multi_rank.h"
#include "train/trainer.h"
#include "run_outputs.h"
#include "train_test_util.h"
#include "common/remove_tree.h"
#include "model/safetensors.h"

namespace fs = std::filesystem;

namespace ulysses {
namespace {

// Step 1 starts from identical weights, so its gradients agree to the equivalence tolerance, 1e-4
// per tensor and their norm far closer. Later steps start from weights that differ by the fp32
// rounding differences of earlier updates. Measured: every step of every mesh within 4e-7 of sp 1.
// An sp-times factor is off by 100% (sp 2) or 300% (sp 4).
constexpr double kFirstStepRelTol = 1e-5;
constexpr double kLaterStepRelTol = 1e-4;
constexpr int64_t kSteps = 6;

TEST(TrainingRunGradNorm, SameGradNormPerStepForEverySequenceParallelDegree) {
  const std::string dir = testing::shared_dir("grad-norm-test", "sp");
  struct Mesh {
    int64_t dp, sp;
  };
  const std::vector<Mesh> meshes = {{1, 1}, {1, 2}, {1, 4}, {2, 2}};
  std::vector<std::vector<testing::StepRecord>> runs;
  for (const Mesh& m : meshes) {
    config::RunConfig c = testing::tiny_run_config(8, 2, m.dp, m.sp);
    c.model.init_std = 0.05;
    c.sequence.length = 32;
    c.sequence.micro_batch = 2 / m.dp;  // the same global batch of 2 samples on every mesh
    c.optim.lr = 1e-2;
    c.optim.grad_clip = 1.0;
    c.train.steps = kSteps;
    c.profile.warmup_steps = 0;
    c.output.dir = dir + "/dp" + std::to_string(m.dp) + "sp" + std::to_string(m.sp);
    testing::run_ranks(static_cast<int>(m.dp * m.sp), [&](const testing::RankContext& ctx) {
      auto mesh = comm::DeviceMesh::create_for_test(ctx.rank, ctx.world, ctx.store_path, m.dp, m.sp);
      EXPECT_EQ(train::run_training(c, mesh, at::Device(at::kCPU)), 0);
    });
    if (!testing::in_rank_child()) runs.push_back(testing::read_steps(c.output.dir + "/metrics.jsonl"));
  }
  if (testing::in_rank_child()) return;

  const auto& base = runs[0];
  ASSERT_EQ(base.size(), static_cast<size_t>(kSteps));
  // Clipping is active on step 1, so clipped updates alone would hide a constant factor.
  EXPECT_GT(base[0].grad_norm, 1.0);
  for (size_t i = 1; i < runs.size(); ++i) {
    ASSERT_EQ(runs[i].size(), base.size()) << "dp " << meshes[i].dp << " sp " << meshes[i].sp;
    for (size_t s = 0; s < base.size(); ++s) {
      const double tol = (s == 0 ? kFirstStepRelTol : kLaterStepRelTol) * base[s].grad_norm;
      EXPECT_NEAR(runs[i][s].grad_norm, base[s].grad_norm, tol)
          << "dp " << meshes[i].dp << " sp " << meshes[i].sp << " step " << s + 1;
      EXPECT_NEAR(runs[i][s].loss, base[s].loss, kLaterStepRelTol * base[s].loss)
          << "dp " << meshes[i].dp << " sp " << meshes[i].sp << " step " << s + 1;
    }
  }
  ulysses::remove_tree(dir);
}

// memory.precision bf16-states (bf16 gradient sums and AdamW moments, no masters) in whole
// runs on CPU: sp 2 on real Gloo ranks against one process, a resume from a checkpoint against
// the run it continues, and transformers' LlamaForCausalLM in bf16 with torch.optim.AdamW(
// fused=True) on the same weights and tokens.
//
// Tolerances. grad_norm is computed as torch's clip_grad_norm_ computes it on bf16 gradients: a
// bf16 value, so two norms whose exact values differ by far less than an ulp can still round one
// ulp apart, up to 2^-7 relative (just above a power of two); the tolerance is two such ulps,
// 1.6e-2 relative. (Measured: the same bf16 value, or one ulp apart.) An sp-times gradient is off
// by 100%, a sum over the ranks left out by ~30%.
// Losses: sp 2 against one process runs the same forward arithmetic (the all-to-all moves values
// without changing them; each rank computes whole heads over the whole sequence), so step 1 agrees
// to fp32 summation order; later steps start from weights that differ where the bf16 sum of two
// partial gradients rounded apart from one rounding of the whole, and AdamW normalizes, so such an
// element moves by up to 2 lr: at lr 2e-3 on weights of ~0.05 a loss moves by well under 1e-3
// relative. transformers: its LM head and logits are bf16 (ours fp32), its RMSNorm and rotary
// round in other places: ~40 bf16 roundings on the forward path, sqrt(40) x 2.3e-3 = 1.5e-2
// relative on logits of ~0.5, ~7e-3 per token's loss with a random sign, averaged over the 62
// labels of a step: ~1e-3 absolute, 2.5e-4 relative of a loss of ~4.1. Tolerance 2e-3 relative
// for both (measured against transformers: 3e-5, 1.8e-4 and 2.5e-5 relative on steps 1-3).
constexpr double kBf16StatesNormRelTol = 1.6e-2;
constexpr double kBf16StatesLossRelTol = 2e-3;

// Runs `command`, returns its standard output (the command's exit status must be 0).
std::string output_of(const std::string& command) {
  std::string out;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return out;
  char buffer[4096];
  size_t n = 0;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, n);
  EXPECT_EQ(pclose(pipe), 0) << command << "\n" << out;
  return out;
}

TEST(TrainingRunBf16States, Sp2AndResumeMatchOneProcessAndTransformersFusedAdamW) {
  const std::string dir = testing::shared_dir("bf16-states-test", "run");
  constexpr int64_t kLength = 32, kBatch = 2, kRunSteps = 3;
  const std::string tokens = dir + "/train.u16";
  config::RunConfig c = testing::tiny_run_config(4, 2, 1, 1);
  c.model.init_std = 0.05;
  c.memory.precision = "bf16-states";
  c.data.source = "tokens:" + tokens;
  c.data.token_dtype = "uint16";
  c.sequence.length = kLength;
  c.sequence.micro_batch = kBatch;
  c.optim.lr = 2e-3;
  c.optim.grad_clip = 1.0;
  c.optim.warmup_steps = 0;
  c.optim.schedule = "constant";
  c.train.steps = kRunSteps;
  c.profile.warmup_steps = 0;
  if (!testing::in_rank_child()) {
    std::mt19937 rng(11);
    std::uniform_int_distribution<int> token(0, static_cast<int>(c.model.vocab_size) - 1);
    std::ofstream out(tokens, std::ios::binary);
    for (int64_t i = 0; i < (kRunSteps * kBatch + 1) * kLength; ++i) {
      const uint16_t t = static_cast<uint16_t>(token(rng));
      out.write(reinterpret_cast<const char*>(&t), sizeof(t));  // little-endian host
    }
  }
  // One process, saving its initial weights and every step.
  config::RunConfig one = c;
  one.output.dir = dir + "/sp1";
  one.checkpoint.dir = dir + "/sp1-ckpt";
  one.checkpoint.every = 1;
  one.checkpoint.save_initial = true;
  testing::train_on_ranks(one);
  // sp 2 over two Gloo ranks.
  config::RunConfig sp2 = c;
  sp2.mesh.sp = 2;
  sp2.output.dir = dir + "/sp2";
  testing::train_on_ranks(sp2);
  // One process resumed from the first run's step 2.
  config::RunConfig resumed = c;
  resumed.output.dir = dir + "/resumed";
  resumed.checkpoint.dir = dir + "/resumed-ckpt";
  resumed.checkpoint.resume = one.checkpoint.dir + "/step-2";
  testing::train_on_ranks(resumed);
  if (testing::in_rank_child()) return;

  const auto base = testing::read_steps(one.output.dir + "/metrics.jsonl");
  const auto split = testing::read_steps(sp2.output.dir + "/metrics.jsonl");
  const auto cont = testing::read_steps(resumed.output.dir + "/metrics.jsonl");
  ASSERT_EQ(base.size(), static_cast<size_t>(kRunSteps));
  ASSERT_EQ(split.size(), base.size());
  EXPECT_GT(base[0].grad_norm, 1.0);  // clipping is on
  for (size_t s = 0; s < base.size(); ++s) {
    EXPECT_NEAR(split[s].loss, base[s].loss, kBf16StatesLossRelTol * base[s].loss) << s + 1;
    EXPECT_NEAR(split[s].grad_norm, base[s].grad_norm, kBf16StatesNormRelTol * base[s].grad_norm)
        << s + 1;
    std::printf("step %zu  loss sp1 %.6f sp2 %.6f  grad_norm sp1 %.7f sp2 %.7f\n", s + 1,
                base[s].loss, split[s].loss, base[s].grad_norm, split[s].grad_norm);
  }
  // The resumed run's step 3 is the uninterrupted one's, bit for bit, and so are its weights and
  // AdamW state: bf16 moments, no masters, and weights exported in bf16 as the bf16 mode does.
  ASSERT_EQ(cont.size(), 1u);
  EXPECT_EQ(cont[0].loss, base[2].loss);
  EXPECT_EQ(cont[0].grad_norm, base[2].grad_norm);
  for (const std::string file : {"model.safetensors", "optimizer.safetensors"}) {
    const auto a = model::load_safetensors(one.checkpoint.dir + "/step-3/" + file);
    const auto b = model::load_safetensors(resumed.checkpoint.dir + "/step-3/" + file);
    ASSERT_EQ(a.size(), b.size()) << file;
    for (const auto& [name, tensor] : a) {
      ASSERT_TRUE(b.count(name)) << file << " " << name;
      EXPECT_TRUE(torch::equal(tensor, b.at(name))) << file << " " << name;
      EXPECT_EQ(name.find(".master"), std::string::npos) << file << " " << name;
      if (tensor.is_floating_point()) {
        EXPECT_EQ(tensor.scalar_type(), at::kBFloat16) << name;
      }
    }
  }

  // transformers in bf16 with torch's fused AdamW from the same initial weights.
  const char* python = std::getenv("ULYSSES_PYTHON");
  if (python == nullptr || *python == '\0') GTEST_SKIP() << "ULYSSES_PYTHON not set";
  const std::string script = std::string(ULYSSES_SOURCE_DIR) + "/tests/train/bf16_states_reference.py";
  std::ostringstream command;
  command << python << " " << script << " --model " << one.checkpoint.dir << "/initial"
          << " --tokens " << tokens << " --length " << kLength << " --batch " << kBatch
          << " --steps " << kRunSteps << " --lr " << c.optim.lr << " --betas " << c.optim.betas[0]
          << " " << c.optim.betas[1] << " --eps " << c.optim.eps << " --weight-decay "
          << c.optim.weight_decay << " --grad-clip " << c.optim.grad_clip;
  const std::string out = output_of(command.str());
  const nlohmann::json theirs = nlohmann::json::parse(out.substr(out.rfind('{')));
  ASSERT_EQ(theirs["losses"].size(), base.size()) << out;
  for (size_t s = 0; s < base.size(); ++s) {
    const double loss = theirs["losses"][s].get<double>();
    const double norm = theirs["grad_norms"][s].get<double>();
    EXPECT_NEAR(base[s].loss, loss, kBf16StatesLossRelTol * loss) << "step " << s + 1;
    EXPECT_NEAR(base[s].grad_norm, norm, kBf16StatesNormRelTol * norm) << "step " << s + 1;
    std::printf("step %zu  loss ours %.6f transformers %.6f  grad_norm ours %.5f transformers %.5f\n",
                s + 1, base[s].loss, loss, base[s].grad_norm, norm);
  }
  ulysses::remove_tree(dir);
}

}  // namespace
}  // namespace ulysses
