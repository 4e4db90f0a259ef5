// HF weights: hf_state -> safetensors -> load_hf_weights reproduces the forward exactly, sharded
// checkpoints with an index, tied embeddings, and clear errors; HfWeightIndex's range reads.
#include "model/hf_weights.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/input_file.h"
#include "model/materialize.h"
#include "model/safetensors.h"
#include "model_test_util.h"

namespace ulysses::model {
namespace {

using testing::TempDir;
using testing::tiny_options;

at::Tensor forward_of(LlamaForCausalLM& model) {
  torch::manual_seed(21);
  at::Tensor ids = torch::randint(0, 37, {2, 7}, at::kLong);
  at::Tensor pos = at::arange(7, at::kLong).unsqueeze(0).repeat({2, 1});
  return model->forward_hidden(ids, pos, {});  // [2, 7, h]
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST(HfWeights, SaveThenLoadGivesIdenticalForward) {
  TempDir dir;
  LlamaForCausalLM source(tiny_options(false, 1)), target(tiny_options(false, 2));
  save_safetensors(dir.file("model.safetensors"), hf_state(source), {{"format", "pt"}});
  ASSERT_FALSE(at::equal(forward_of(source), forward_of(target)));
  load_hf_weights(target, dir.str());
  EXPECT_TRUE(at::equal(forward_of(source), forward_of(target)));
  EXPECT_TRUE(at::equal(source->lm_head_weight(), target->lm_head_weight()));
}

TEST(HfWeights, ShardedCheckpointWithIndex) {
  TempDir dir;
  LlamaForCausalLM source(tiny_options(false, 3)), target(tiny_options(false, 4));
  auto state = hf_state(source);
  const size_t split = state.size() / 2;
  std::vector<std::pair<std::string, at::Tensor>> first(state.begin(), state.begin() + split),
      second(state.begin() + split, state.end());
  save_safetensors(dir.file("model-00001-of-00002.safetensors"), first);
  save_safetensors(dir.file("model-00002-of-00002.safetensors"), second);
  // A stray file that the index does not list must not be read.
  save_safetensors(dir.file("stray.safetensors"), {{"junk", torch::ones({1})}});
  nlohmann::json index = {{"metadata", {{"total_size", 0}}},
                          {"weight_map", nlohmann::json::object()}};
  for (size_t i = 0; i < state.size(); ++i) {
    index["weight_map"][state[i].first] =
        i < split ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  std::ofstream(dir.file("model.safetensors.index.json")) << index.dump(2);
  load_hf_weights(target, dir.str());
  EXPECT_TRUE(at::equal(forward_of(source), forward_of(target)));
}

TEST(HfWeights, ModelFileBesideOtherSafetensorsOrShardsWithoutIndex) {
  LlamaForCausalLM source(tiny_options(false, 10)), target(tiny_options(false, 11));
  auto state = hf_state(source);
  {
    TempDir dir;  // a training checkpoint: only model.safetensors holds weights
    save_safetensors(dir.file("model.safetensors"), state);
    save_safetensors(dir.file("optimizer.safetensors"), {{"exp_avg.0", torch::ones({2})}});
    load_hf_weights(target, dir.str());
    EXPECT_TRUE(at::equal(forward_of(source), forward_of(target)));
  }
  LlamaForCausalLM other(tiny_options(false, 12));
  {
    TempDir dir;  // shards without an index: every *.safetensors file
    std::vector<std::pair<std::string, at::Tensor>> first(state.begin(), state.begin() + 5),
        second(state.begin() + 5, state.end());
    save_safetensors(dir.file("part-a.safetensors"), first);
    save_safetensors(dir.file("part-b.safetensors"), second);
    load_hf_weights(other, dir.str());
    EXPECT_TRUE(at::equal(forward_of(source), forward_of(other)));
  }
}

TEST(HfWeights, TiedModelOmitsAndIgnoresLmHead) {
  TempDir dir;
  LlamaForCausalLM source(tiny_options(true, 5)), target(tiny_options(true, 6));
  auto state = hf_state(source);
  for (const auto& item : state) EXPECT_NE(item.first, "lm_head.weight");
  EXPECT_EQ(state.front().first, "model.embed_tokens.weight");
  EXPECT_EQ(state.back().first, "model.norm.weight");
  state.emplace_back("lm_head.weight", torch::zeros({37, 16}));  // as some HF exports have it
  save_safetensors(dir.file("model.safetensors"), state);
  load_hf_weights(target, dir.str());
  EXPECT_TRUE(at::equal(forward_of(source), forward_of(target)));
}

TEST(HfWeights, LoadsBf16IntoFp32Parameters) {
  TempDir dir;
  LlamaForCausalLM source(tiny_options(false, 7)), target(tiny_options(false, 8));
  std::vector<std::pair<std::string, at::Tensor>> bf16_state;
  for (auto& [name, t] : hf_state(source)) bf16_state.emplace_back(name, t.to(at::kBFloat16));
  save_safetensors(dir.file("model.safetensors"), bf16_state);
  load_hf_weights(target, dir.str());
  auto params = target->named_parameters();
  for (auto& [name, t] : bf16_state) {
    EXPECT_EQ(params[name].scalar_type(), at::kFloat);
    EXPECT_TRUE(at::equal(params[name], t.to(at::kFloat))) << name;
  }
}

TEST(HfWeights, ClearErrors) {
  LlamaForCausalLM model(tiny_options(false, 9));
  {
    TempDir dir;
    EXPECT_EQ(error_of([&] { load_hf_weights(model, dir.str()); }),
              dir.str() + ": no *.safetensors weight files");
  }
  {
    TempDir dir;  // missing tensor
    auto state = hf_state(model);
    state.erase(state.begin() + 4);  // embed, q, k, v, o_proj
    save_safetensors(dir.file("model.safetensors"), state);
    EXPECT_EQ(error_of([&] { load_hf_weights(model, dir.str()); }),
              dir.str() + ": tensor 'model.layers.0.self_attn.o_proj.weight' is missing from the " +
                  "weight files");
  }
  {
    TempDir dir;  // wrong shape
    auto state = hf_state(model);
    state[1].second = torch::zeros({3, 16});
    save_safetensors(dir.file("model.safetensors"), state);
    EXPECT_EQ(error_of([&] { load_hf_weights(model, dir.str()); }),
              dir.file("model.safetensors") + ": tensor 'model.layers.0.self_attn.q_proj.weight' " +
                  "has shape [3, 16], the model expects [16, 16]");
  }
  {
    TempDir dir;  // a checkpoint with more layers than the config
    config::ModelOptions three = tiny_options(false, 9);
    three.num_layers = 3;
    LlamaForCausalLM bigger(three);
    save_safetensors(dir.file("model.safetensors"), hf_state(bigger));
    const std::string what = error_of([&] { load_hf_weights(model, dir.str()); });
    EXPECT_NE(what.find("'model.layers.2."), std::string::npos) << what;
    EXPECT_NE(what.find("is not a parameter of this model"), std::string::npos) << what;
  }
  for (const std::string shard : {"../model.safetensors", "/etc/passwd", "sub/../../x"}) {
    TempDir dir;  // an index naming a file outside the model directory
    save_safetensors(dir.file("model.safetensors"), hf_state(model));
    const nlohmann::json index = {{"weight_map", {{"model.embed_tokens.weight", shard}}}};
    std::ofstream(dir.file("model.safetensors.index.json")) << index.dump();
    EXPECT_EQ(error_of([&] { load_hf_weights(model, dir.str()); }),
              dir.file("model.safetensors.index.json") + ": weight_map file '" + shard +
                  "' is not a path inside the model directory");
  }
  {
    TempDir dir;  // an index over the input cap is refused before it is parsed
    save_safetensors(dir.file("model.safetensors"), hf_state(model));
    const std::string index = dir.file("model.safetensors.index.json");
    std::ofstream(index) << "{}";
    std::filesystem::resize_file(index, kMaxInputFileBytes + 1);  // sparse
    EXPECT_EQ(error_of([&] { load_hf_weights(model, dir.str()); }),
              index + ": 16.0 MiB is over the 16 MiB limit of a JSON file");
  }
}

// The parameters' names and shapes, as HfWeightIndex takes them.
std::vector<std::pair<std::string, std::vector<int64_t>>> shapes_of(LlamaForCausalLM& model) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  for (const auto& item : model->named_parameters()) {
    out.emplace_back(item.key(), item.value().sizes().vec());
  }
  return out;
}

// HfWeightIndex (ZeRO-3's sharded load) reads any element range of any tensor, from a checkpoint
// spread over two files with an index, converted to the caller's dtype; its errors are
// load_hf_weights' errors, word for word.
TEST(HfWeightIndex, ReadsRangesAndRefusesWhatLoadHfWeightsRefuses) {
  LlamaForCausalLM model(tiny_options(false, 9));
  const auto state = hf_state(model);
  {
    TempDir dir;
    const std::vector<std::pair<std::string, at::Tensor>> first(state.begin(), state.begin() + 3);
    const std::vector<std::pair<std::string, at::Tensor>> second(state.begin() + 3, state.end());
    save_safetensors(dir.file("a.safetensors"), first);
    save_safetensors(dir.file("b.safetensors"), second);
    nlohmann::json map;
    for (const auto& [name, t] : first) map[name] = "a.safetensors";
    for (const auto& [name, t] : second) map[name] = "b.safetensors";
    std::ofstream(dir.file("model.safetensors.index.json")) << nlohmann::json{{"weight_map", map}};
    const HfWeightIndex index(dir.str(), shapes_of(model), false);
    for (const auto& [name, t] : state) {
      const at::Tensor flat = t.reshape({-1});
      const int64_t begin = flat.numel() / 3, count = flat.numel() / 2;
      at::Tensor out = at::empty({count});
      index.read(name, begin, out);
      EXPECT_TRUE(at::equal(out, flat.narrow(0, begin, count))) << name;
      at::Tensor half = at::empty({count}, at::kBFloat16);
      index.read(name, begin, half);
      EXPECT_TRUE(at::equal(half, flat.narrow(0, begin, count).to(at::kBFloat16))) << name;
    }
  }
  auto both_errors = [&](const std::string& dir) {
    const std::string whole = error_of([&] { load_hf_weights(model, dir); });
    const std::string ranges = error_of([&] { HfWeightIndex(dir, shapes_of(model), false); });
    EXPECT_FALSE(whole.empty());
    EXPECT_EQ(ranges, whole);
  };
  {
    TempDir dir;  // missing tensor
    auto missing = state;
    missing.erase(missing.begin() + 4);
    save_safetensors(dir.file("model.safetensors"), missing);
    both_errors(dir.str());
  }
  {
    TempDir dir;  // wrong shape
    auto wrong = state;
    wrong[1].second = torch::zeros({3, 16});
    save_safetensors(dir.file("model.safetensors"), wrong);
    both_errors(dir.str());
  }
  {
    TempDir dir;  // more layers than the model
    config::ModelOptions three = tiny_options(false, 9);
    three.num_layers = 3;
    LlamaForCausalLM bigger(three);
    save_safetensors(dir.file("model.safetensors"), hf_state(bigger));
    both_errors(dir.str());
  }
}

// A model built with its weights deferred and materialized on CPU holds the weights a model
// initialised at construction holds, bit for bit, in fp32 and cast to bf16.
TEST(Materialize, OnCpuTheWeightsAreTheConstructionInitBitForBit) {
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    LlamaForCausalLM built(tiny_options(false, 5));
    built->to(at::kCPU, dtype);
    LlamaForCausalLM deferred(tiny_options(false, 5), WeightInit::kDeferred);
    materialize_weights(deferred, at::Device(at::kCPU), dtype, "");
    const auto want = built->named_parameters(), got = deferred->named_parameters();
    ASSERT_EQ(got.size(), want.size());
    for (const auto& item : want) {
      ASSERT_EQ(got[item.key()].scalar_type(), dtype) << item.key();
      EXPECT_TRUE(at::equal(got[item.key()], item.value())) << item.key();
    }
  }
}

// With a checkpoint the weights are the checkpoint's; a missing tensor is one clear error.
TEST(Materialize, FromACheckpointTheWeightsAreItsValues) {
  TempDir dir;
  LlamaForCausalLM source(tiny_options(true, 6));
  save_safetensors(dir.file("model.safetensors"), hf_state(source), {{"format", "pt"}});
  LlamaForCausalLM deferred(tiny_options(true, 7), WeightInit::kDeferred);
  materialize_weights(deferred, at::Device(at::kCPU), at::kFloat, dir.str());
  EXPECT_TRUE(at::equal(forward_of(source), forward_of(deferred)));

  TempDir partial;
  auto state = hf_state(source);
  state.pop_back();
  save_safetensors(partial.file("model.safetensors"), state, {{"format", "pt"}});
  LlamaForCausalLM incomplete(tiny_options(true, 7), WeightInit::kDeferred);
  EXPECT_NE(error_of([&] {
              materialize_weights(incomplete, at::Device(at::kCPU), at::kFloat, partial.str());
            }).find("is missing from the weight files"),
            std::string::npos);
}

}  // namespace
}  // namespace ulysses::model
