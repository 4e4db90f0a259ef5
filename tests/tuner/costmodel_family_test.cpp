// The cost model across decoder families (config/model_family.h): its parameter count equals the
// parameters of the real model built by src/model for every shipped profile and for tiny shapes
// of each family, and what Qwen2 and Qwen3 add to memory is counted by hand.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "common/error.h"
#include "config/presets.h"
#include "config/run_config.h"
#include "model/llama.h"
#include "model/sdpa_attention.h"
#include "sp/ring_attention.h"
#include "tuner/costmodel/memory_model.h"
#include "tuner/costmodel/time_model.h"
#include "costmodel_test_util.h"

namespace ulysses::costmodel {
namespace {

// numel summed over the named parameters of the model src/model builds from `m`. Deferred init
// leaves the weights as untouched host memory, so even a 12B model costs no resident memory.
int64_t built_parameter_count(const config::ModelOptions& m) {
  model::LlamaForCausalLM built(m, model::WeightInit::kDeferred);
  int64_t total = 0;
  for (const auto& item : built->named_parameters()) total += item.value().numel();
  return total;
}

std::map<std::string, int64_t> by_name(const MemoryPrediction& p) {
  std::map<std::string, int64_t> m;
  for (const MemoryTerm& t : p.terms) m[t.name] = t.bytes;
  return m;
}

// costmodel_test.cpp's tiny run (h 8, L 2, hq 2, hkv 1, hd 4, ffn 16, V 32, sl 16 over sp 2, tiled
// MLP and loss, fp32 on CPU: a Llama of P = 1704) in another family.
config::RunConfig tiny(const std::string& family) { return testing::tiny_run(family); }

TEST(CostModelFamilies, ParameterCountEqualsTheBuiltModelForEveryProfile) {
  const std::vector<std::string> presets = config::available_presets();
  for (const char* required :
       {"tiny", "llama-3.1-8b", "qwen2.5-7b", "qwen3-4b", "qwen3-8b", "mistral-7b-v0.3",
        "mistral-nemo-12b"}) {
    EXPECT_NE(std::find(presets.begin(), presets.end(), required), presets.end()) << required;
  }
  for (const std::string& name : presets) {
    SCOPED_TRACE(name);
    const config::ModelOptions m = config::load_model_preset(name);
    EXPECT_EQ(parameter_count(m), built_parameter_count(m));
  }
}

// The new profiles' sizes as the Hugging Face Hub lists them (its safetensors parameter counts, to
// three digits): a shape typed wrong in a profile moves them.
TEST(CostModelFamilies, ProfilesHaveTheirPublishedSizes) {
  const std::map<std::string, double> billions = {{"qwen2.5-7b", 7.62},
                                                  {"qwen3-4b", 4.02},
                                                  {"qwen3-8b", 8.19},
                                                  {"mistral-7b-v0.3", 7.25},
                                                  {"mistral-nemo-12b", 12.2}};
  for (const auto& [name, size] : billions) {
    const double p = static_cast<double>(parameter_count(config::load_model_preset(name)));
    EXPECT_NEAR(p / 1e9, size, size < 10 ? 0.005 : 0.05) << name;  // half the last digit shown
  }
}

// Tiny shapes of each family, tied and untied, with hq x hd equal to h and not (Qwen3's and
// Mistral-Nemo's explicit head_dim), GQA and MHA.
TEST(CostModelFamilies, ParameterCountEqualsTheBuiltModelForTinyShapes) {
  for (const char* family : {"llama", "qwen2", "qwen3", "mistral"}) {
    for (const bool tied : {false, true}) {
      for (const auto& [hq, hkv, hd] :
           std::vector<std::tuple<int64_t, int64_t, int64_t>>{{4, 2, 4}, {4, 2, 6}, {4, 4, 2}}) {
        config::ModelOptions m;
        m.family = family, m.tie_embeddings = tied;
        m.hidden_size = 16, m.num_layers = 3, m.num_heads = hq, m.num_kv_heads = hkv;
        m.head_dim = hd, m.intermediate_size = 24, m.vocab_size = 40;
        SCOPED_TRACE(std::string(family) + (tied ? " tied" : "") + " hq " + std::to_string(hq) +
                     " hkv " + std::to_string(hkv) + " hd " + std::to_string(hd));
        EXPECT_EQ(parameter_count(m), built_parameter_count(m));
      }
    }
  }
}

// Qwen2: q/k/v biases (hq + 2 hkv) x hd = (2 + 2) x 4 = 16 per layer, P = 1704 + 2 x 16 = 1736.
// They are parameters like any other (weights, fp32 gradients, AdamW moments) and save nothing.
TEST(CostModelFamilies, Qwen2BiasesAreParametersAndSaveNoActivations) {
  const config::RunConfig llama = tiny("llama"), qwen2 = tiny("qwen2");
  EXPECT_EQ(parameter_count(qwen2.model), 1736);
  EXPECT_EQ(layer_parameter_count(qwen2.model), 592 + 16);
  const std::map<std::string, int64_t> m = by_name(predict_memory(qwen2, MemoryCoefficients{}));
  const std::map<std::string, int64_t> base = by_name(predict_memory(llama, MemoryCoefficients{}));
  EXPECT_EQ(m.at("weights"), 1736 * 4);
  EXPECT_EQ(m.at("gradients"), 1736 * 4);
  EXPECT_EQ(m.at("adam moments"), 1736 * 8);
  EXPECT_EQ(m.at("activations"), base.at("activations"));
  EXPECT_EQ(m.at("residual stream"), base.at("residual stream"));
}

// Qwen3: q_norm and k_norm weights 2 hd = 8 per layer, P = 1704 + 16 = 1720. Each layer saves per
// token the q and k projections (hq + hkv) x hd = 12 elements and 1/rms per head in fp32, 3 x 4 B:
// fp32 12 x 4 + 12 = 60 B on top of the Llama layer's 296 B; bf16 12 x 2 + 12 = 36 B on its 152 B.
TEST(CostModelFamilies, Qwen3QkNormsSaveTheirInputsAndOneOverRmsPerHead) {
  config::RunConfig c = tiny("qwen3");
  EXPECT_EQ(parameter_count(c.model), 1720);
  std::map<std::string, int64_t> m = by_name(predict_memory(c, MemoryCoefficients{}));
  EXPECT_EQ(m.at("weights"), 1720 * 4);
  EXPECT_EQ(m.at("activations"), 2 * (296 + 60) * 8);  // L x per token x T
  c.memory.checkpointing = true;                         // recompute: one layer's saved set
  m = by_name(predict_memory(c, MemoryCoefficients{}));
  EXPECT_EQ(m.at("layer recompute"), (296 + 60 + 32 * 4) * 8);
  c = tiny("qwen3");
  c.train.device = "cuda", c.memory.precision = "bf16";
  m = by_name(predict_memory(c, MemoryCoefficients{}));
  EXPECT_EQ(m.at("activations"), 2 * (152 + 36) * 8);
}

// The cost model's copies of the trainer's sizes (memory_model.h), held to the trainer's values.
TEST(CostModelFamilies, MirroredTrainerLimitsEqualTheTrainers) {
  EXPECT_EQ(kRingMathScoreBlockBytes, sp::kRingScoreBlockBytes);
  EXPECT_EQ(kDenseDocumentMaskElements, model::kMaxDenseDocMaskBytes);  // one bool per element
}

// Mistral is Llama's block: the same parameters, memory and work.
TEST(CostModelFamilies, MistralCountsAsLlama) {
  const config::RunConfig llama = tiny("llama"), mistral = tiny("mistral");
  EXPECT_EQ(parameter_count(mistral.model), 1704);
  EXPECT_EQ(predict_memory(mistral, MemoryCoefficients{}).peak_bytes,
            predict_memory(llama, MemoryCoefficients{}).peak_bytes);
  EXPECT_DOUBLE_EQ(step_work(mistral).matmul_flops, step_work(llama).matmul_flops);
}

// The family extras add no FLOPs (elementwise, see profile/flops.h) but travel with the
// gradients: ZeRO-1 all-reduce 2 (w - 1) / w x 4 P over dp 2 x sp 2.
TEST(CostModelFamilies, ExtrasAddNoFlopsButTheirGradientsAreReduced) {
  config::RunConfig llama = tiny("llama"), qwen2 = tiny("qwen2");
  llama.mesh.dp = qwen2.mesh.dp = 2;
  EXPECT_DOUBLE_EQ(step_work(qwen2).matmul_flops, step_work(llama).matmul_flops);
  EXPECT_DOUBLE_EQ(step_work(qwen2).allreduce_bytes, 2 * 0.75 * 4 * 1736);
}

TEST(CostModelFamilies, UnknownFamilyIsAUserError) {
  config::ModelOptions m;
  m.family = "gemma2";
  EXPECT_THROW(parameter_count(m), UserError);
}

}  // namespace
}  // namespace ulysses::costmodel
