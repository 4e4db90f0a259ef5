// HF config.json of every family (Llama, Qwen2/2.5, Qwen3, Mistral): reading real HF files, writing
// checkpoint configs in each family's layout, the write/read round trip, `model.load: DIR` in a
// run config, and errors naming the file.
#include "config/hf_config.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "config/presets.h"
#include "config/run_config.h"
#include "config_test_util.h"

namespace ulysses::config {
namespace {

using nlohmann::json;
using testing::expect_same_shapes;
using testing::expect_user_error;

// meta-llama/Llama-3.2-1B config.json as published on the Hugging Face Hub.
const char* kLlama32_1B = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": 128001,
  "head_dim": 64,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 8192,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 16,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 32.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
})";

// meta-llama/Llama-3.1-8B-Instruct config.json (no head_dim key, eos as a list).
const char* kLlama31_8B_Instruct = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": [128001, 128008, 128009],
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.42.3",
  "use_cache": true,
  "vocab_size": 128256
})";

// Qwen/Qwen2.5-7B config.json as published (q/k/v biases are implied by model_type; the window
// is off: use_sliding_window false).
const char* kQwen25_7B = R"({
  "architectures": ["Qwen2ForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151643,
  "hidden_act": "silu",
  "hidden_size": 3584,
  "initializer_range": 0.02,
  "intermediate_size": 18944,
  "max_position_embeddings": 131072,
  "max_window_layers": 28,
  "model_type": "qwen2",
  "num_attention_heads": 28,
  "num_hidden_layers": 28,
  "num_key_value_heads": 4,
  "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0,
  "sliding_window": 131072,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.43.1",
  "use_cache": true,
  "use_mrope": false,
  "use_sliding_window": false,
  "vocab_size": 152064
})";

// Qwen/Qwen3-8B config.json as published (explicit head_dim; rope_theta an integer).
const char* kQwen3_8B = R"({
  "architectures": ["Qwen3ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 12288,
  "max_position_embeddings": 40960,
  "max_window_layers": 36,
  "model_type": "qwen3",
  "num_attention_heads": 32,
  "num_hidden_layers": 36,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000,
  "sliding_window": null,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

// mistralai/Mistral-7B-v0.3 config.json as published (sliding_window null: no window).
const char* kMistral7B_v03 = R"({
  "architectures": ["MistralForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 32768,
  "model_type": "mistral",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05,
  "rope_theta": 1000000.0,
  "sliding_window": null,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.42.0.dev0",
  "use_cache": true,
  "vocab_size": 32768
})";

TEST(HfConfig, ReadsQwen2Qwen3AndMistral) {
  const ModelOptions qwen2 = model_options_from_hf_config(json::parse(kQwen25_7B), "q2");
  EXPECT_EQ(qwen2.family, "qwen2");
  EXPECT_EQ(qwen2.hidden_size, 3584);
  EXPECT_EQ(qwen2.num_heads, 28);
  EXPECT_EQ(qwen2.num_kv_heads, 4);
  EXPECT_EQ(qwen2.head_dim, 0);  // resolved by validation to 3584 / 28 = 128
  EXPECT_EQ(qwen2.sliding_window, 0);  // use_sliding_window false
  EXPECT_EQ(qwen2.rms_norm_eps, 1e-6);

  const ModelOptions qwen3 = model_options_from_hf_config(json::parse(kQwen3_8B), "q3");
  EXPECT_EQ(qwen3.family, "qwen3");
  EXPECT_EQ(qwen3.head_dim, 128);
  EXPECT_EQ(qwen3.rope_theta, 1.0e6);
  EXPECT_EQ(qwen3.eos_token_id, 151645);
  EXPECT_EQ(qwen3.sliding_window, 0);
  // Qwen3Config's head_dim default is 128, not hidden_size / num_heads.
  json no_head_dim = json::parse(kQwen3_8B);
  no_head_dim.erase("head_dim");
  no_head_dim["hidden_size"] = 2560;
  EXPECT_EQ(model_options_from_hf_config(no_head_dim, "q3").head_dim, 128);

  const ModelOptions mistral = model_options_from_hf_config(json::parse(kMistral7B_v03), "m");
  EXPECT_EQ(mistral.family, "mistral");
  EXPECT_EQ(mistral.vocab_size, 32768);
  EXPECT_EQ(mistral.sliding_window, 0);
}

TEST(HfConfig, SlidingWindowAsTransformersReadsIt) {
  json mistral = json::parse(kMistral7B_v03);
  mistral["sliding_window"] = 4096;  // Mistral-7B-v0.1
  EXPECT_EQ(model_options_from_hf_config(mistral, "m").sliding_window, 4096);
  mistral.erase("sliding_window");  // MistralConfig's default
  EXPECT_EQ(model_options_from_hf_config(mistral, "m").sliding_window, 4096);
  // Qwen: only with use_sliding_window, and only if a layer gets the window (transformers gives it
  // to layers max_window_layers and up, or to those layer_types names).
  json qwen = json::parse(kQwen25_7B);
  qwen["use_sliding_window"] = true;
  EXPECT_EQ(model_options_from_hf_config(qwen, "q").sliding_window, 0);  // max_window_layers 28
  qwen["max_window_layers"] = 21;
  EXPECT_EQ(model_options_from_hf_config(qwen, "q").sliding_window, 131072);
  qwen["layer_types"] = json::array({"full_attention", "full_attention"});
  EXPECT_EQ(model_options_from_hf_config(qwen, "q").sliding_window, 0);
  qwen["layer_types"][1] = "sliding_attention";
  EXPECT_EQ(model_options_from_hf_config(qwen, "q").sliding_window, 131072);
  // A window longer than the sequence changes nothing and trains; a shorter one is refused.
  testing::TempDir dir;
  mistral["sliding_window"] = 4096;
  dir.write("config.json", mistral.dump());
  EXPECT_EQ(parse_run_config_yaml("model: {load: " + dir.path() + "}\nsequence: {length: 4096}\n")
                .model.sliding_window,
            4096);
  expect_user_error(
      [&] {
        parse_run_config_yaml("model: {load: " + dir.path() + "}\nsequence: {length: 4097}\n");
      },
      "model.sliding_window: 4096 is shorter than sequence.length 4097: sliding-window attention "
      "is not implemented (a model without a window, such as Mistral v0.3, or a sequence no "
      "longer than the window)");
}

TEST(HfConfig, WritesEachFamilyInItsOwnLayout) {
  ModelOptions model = load_model_preset("tiny");
  const struct {
    const char* family;
    const char* architecture;
  } families[] = {{"llama", "LlamaForCausalLM"},
                  {"mistral", "MistralForCausalLM"},
                  {"qwen2", "Qwen2ForCausalLM"},
                  {"qwen3", "Qwen3ForCausalLM"}};
  for (const auto& f : families) {
    SCOPED_TRACE(f.family);
    model.family = f.family;
    const json written = to_hf_config_json(model);
    EXPECT_EQ(written["architectures"], json::array({f.architecture}));
    EXPECT_EQ(written["model_type"], f.family);
    const ModelOptions read = model_options_from_hf_config(json::parse(written.dump()), "w");
    EXPECT_EQ(read.family, f.family);
    EXPECT_EQ(read.sliding_window, 0);
    expect_same_shapes(read, model);
  }
  model.family = "qwen2";
  EXPECT_EQ(to_hf_config_json(model)["use_sliding_window"], false);
  EXPECT_TRUE(to_hf_config_json(model)["sliding_window"].is_null());
  EXPECT_FALSE(to_hf_config_json(model).contains("attention_bias"));  // implied q/k/v biases
  model.family = "qwen3";
  EXPECT_EQ(to_hf_config_json(model)["attention_bias"], false);
  model.family = "mistral";
  model.sliding_window = 8192;
  EXPECT_EQ(to_hf_config_json(model)["sliding_window"], 8192);
  EXPECT_EQ(model_options_from_hf_config(to_hf_config_json(model), "w").sliding_window, 8192);
  model.family = "qwen3";  // every layer gets the window written
  EXPECT_EQ(to_hf_config_json(model)["max_window_layers"], 0);
  EXPECT_EQ(model_options_from_hf_config(to_hf_config_json(model), "w").sliding_window, 8192);
}

TEST(HfConfig, ReadsLlama32_1BLikeThePreset) {
  const ModelOptions from_hf = model_options_from_hf_config(json::parse(kLlama32_1B), "1b");
  EXPECT_EQ(from_hf.hidden_size, 2048);
  EXPECT_EQ(from_hf.num_layers, 16);
  EXPECT_EQ(from_hf.num_kv_heads, 8);
  EXPECT_EQ(from_hf.rope_scaling_type, "llama3");
  EXPECT_EQ(from_hf.rope_scaling_factor, 32.0);
  EXPECT_TRUE(from_hf.tie_embeddings);
  expect_same_shapes(from_hf, load_model_preset("llama-3.2-1b"));
}

TEST(HfConfig, ReadsLlama31_8BInstructLikeThePreset) {
  ModelOptions from_hf = model_options_from_hf_config(json::parse(kLlama31_8B_Instruct), "8b");
  EXPECT_EQ(from_hf.head_dim, 0);           // absent: resolved by validation
  EXPECT_EQ(from_hf.eos_token_id, 128001);  // first of the list
  RunConfig config;
  config.model = from_hf;
  validate(config);
  EXPECT_EQ(config.model.head_dim, 128);
  expect_same_shapes(config.model, load_model_preset("llama-3.1-8b"));
}

// transformers >= 5 writes RoPE as "rope_parameters" (theta and scaling in one object).
TEST(HfConfig, ReadsTransformers5RopeParameters) {
  const nlohmann::json llama3 = nlohmann::json::parse(R"({
    "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "intermediate_size": 128, "vocab_size": 256, "rope_scaling": null,
    "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                        "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                        "original_max_position_embeddings": 8192}})");
  const ModelOptions m = model_options_from_hf_config(llama3, "config.json");
  EXPECT_EQ(m.rope_theta, 500000.0);
  EXPECT_EQ(m.rope_scaling_type, "llama3");
  EXPECT_EQ(m.rope_scaling_factor, 8.0);
  EXPECT_EQ(m.rope_original_max_position, 8192);
  nlohmann::json plain = llama3;
  plain["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 250000.0}};
  const ModelOptions d = model_options_from_hf_config(plain, "config.json");
  EXPECT_EQ(d.rope_theta, 250000.0);
  EXPECT_EQ(d.rope_scaling_type, "");
}

TEST(HfConfig, WritesWhatTransformersExpects) {
  ModelOptions tiny = load_model_preset("tiny");
  tiny.head_dim = 0;  // written resolved
  const json written = to_hf_config_json(tiny);
  EXPECT_EQ(written["architectures"], json::array({"LlamaForCausalLM"}));
  EXPECT_EQ(written["model_type"], "llama");
  EXPECT_EQ(written["hidden_act"], "silu");
  EXPECT_EQ(written["attention_bias"], false);
  EXPECT_EQ(written["mlp_bias"], false);
  EXPECT_EQ(written["torch_dtype"], "float32");
  EXPECT_EQ(written["head_dim"], 32);
  EXPECT_EQ(written["num_hidden_layers"], 2);
  EXPECT_EQ(written["num_key_value_heads"], 2);
  EXPECT_EQ(written["tie_word_embeddings"], false);
  EXPECT_TRUE(written["rope_scaling"].is_null());
  EXPECT_EQ(to_hf_config_json(tiny, "bfloat16")["torch_dtype"], "bfloat16");

  const json llama = to_hf_config_json(load_model_preset("llama-3.1-8b"));
  EXPECT_EQ(llama["rope_scaling"]["rope_type"], "llama3");
  EXPECT_EQ(llama["rope_scaling"]["factor"], 8.0);
  EXPECT_EQ(llama["rope_scaling"]["original_max_position_embeddings"], 8192);
}

TEST(HfConfig, WriteThenReadRoundTripsEveryPreset) {
  for (const std::string& name : available_presets()) {
    SCOPED_TRACE(name);
    const ModelOptions preset = load_model_preset(name);
    const json text = json::parse(to_hf_config_json(preset).dump(2));
    expect_same_shapes(model_options_from_hf_config(text, name), preset);
  }
}

TEST(HfConfig, RunConfigLoadTakesShapesFromTheDirectory) {
  testing::TempDir dir;
  dir.write("config.json", kLlama32_1B);
  const RunConfig c = parse_run_config_yaml(
      "model: {load: " + dir.path() + ", init_seed: 7, rope_theta: 1000000}\n", {});
  EXPECT_EQ(c.model.load, dir.path());
  EXPECT_EQ(c.model.hidden_size, 2048);
  EXPECT_EQ(c.model.num_layers, 16);
  EXPECT_EQ(c.model.init_seed, 7u);
  EXPECT_EQ(c.model.rope_theta, 1.0e6);  // inline fields win over config.json
  testing::expect_same_config(parse_run_config_yaml(to_yaml(c), {}), c);
}

TEST(HfConfig, ErrorsNameTheFileAndKey) {
  testing::TempDir dir;
  const std::string file = dir.path() + "/config.json";
  expect_user_error([&] { read_hf_config(dir.path()); }, file + ": cannot read file");

  auto with = [](const std::string& key, const json& value) {
    json config = json::parse(kLlama32_1B);
    if (value.is_discarded()) {
      config.erase(key);
    } else {
      config[key] = value;
    }
    return config;
  };
  const json drop = json(json::value_t::discarded);
  const struct {
    json config;
    std::string message;
  } cases[] = {
      {with("hidden_size", drop), "hidden_size: missing (required for a decoder model)"},
      {with("hidden_size", "big"), "hidden_size: expected an integer, got \"big\""},
      {with("rope_theta", true), "rope_theta: expected a number, got true"},
      {with("model_type", "gemma2"),
       "model_type: 'gemma2' is not supported (supported: llama, mistral, qwen2, qwen3)"},
      {with("attention_bias", true),
       "attention_bias: true is not supported (llama has no biases)"},
      {with("mlp_bias", true), "mlp_bias: true is not supported (llama has no biases)"},
      {with("hidden_act", "gelu"), "hidden_act: 'gelu' is not supported (silu only)"},
      {with("rope_scaling", {{"rope_type", "longrope"}, {"factor", 4.0}}),
       "rope_scaling.rope_type: 'longrope' is not supported (default, linear, dynamic, yarn or "
       "llama3)"},
      {with("rope_scaling", {{"type", "su"}}),
       "rope_scaling.type: 'su' is not supported (default, linear, dynamic, yarn or llama3)"},
      {with("rope_scaling", {{"rope_type", "linear"}}),
       "rope_scaling.factor: missing (required for a decoder model)"},
      {with("rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}, {"attention_factor", 0}}),
       "rope_scaling.attention_factor: must be > 0, got 0"},
      {with("rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0},
                             {"partial_rotary_factor", 0.5}}),
       "rope_scaling.partial_rotary_factor: RoPE on part of the head dim is not supported with "
       "yarn scaling"},
      {with("rope_scaling", {{"full_attention", {{"rope_type", "default"}}}}),
       "rope_scaling.full_attention: RoPE parameters per layer type are not supported (one "
       "object for every layer)"},
  };
  for (const auto& c : cases) {
    dir.write("config.json", c.config.dump());
    expect_user_error([&] { read_hf_config(dir.path()); }, file + ": " + c.message);
  }

  dir.write("config.json", "{\"hidden_size\": 2048,");
  testing::expect_user_error_prefix([&] { read_hf_config(dir.path()); }, file + ": invalid JSON (");
  testing::expect_user_error_prefix(
      [&] { parse_run_config_yaml("model: {load: " + dir.path() + "}\n"); },
      file + ": invalid JSON (");
}

// A checkpoint of a loaded model writes the source's token ids as they were there (null, a list,
// absent), except an id the run config changed.
TEST(HfConfig, KeepsSourceTokenIds) {
  const json source = json::parse(R"({
    "model_type": "qwen2", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "intermediate_size": 128, "vocab_size": 256, "bos_token_id": null,
    "eos_token_id": [7, 9], "pad_token_id": null})");
  ModelOptions model = model_options_from_hf_config(source, "src");
  EXPECT_EQ(model.eos_token_id, 7);
  json written = to_hf_config_json(model);
  EXPECT_EQ(written["bos_token_id"], 1);  // ModelOptions' default: the null is not kept there
  keep_source_token_ids(source, "src", model, written);
  EXPECT_TRUE(written["bos_token_id"].is_null());
  EXPECT_EQ(written["eos_token_id"], json::array({7, 9}));
  EXPECT_TRUE(written.contains("pad_token_id") && written["pad_token_id"].is_null());

  model.eos_token_id = 11;  // set by the run config: written as set
  written = to_hf_config_json(model);
  keep_source_token_ids(source, "src", model, written);
  EXPECT_EQ(written["eos_token_id"], 11);
  EXPECT_TRUE(written["bos_token_id"].is_null());

  json absent = source;  // absent stays absent (transformers applies its family default)
  absent.erase("bos_token_id");
  absent.erase("pad_token_id");
  model = model_options_from_hf_config(absent, "src");
  written = to_hf_config_json(model);
  keep_source_token_ids(absent, "src", model, written);
  EXPECT_FALSE(written.contains("bos_token_id"));
  EXPECT_FALSE(written.contains("pad_token_id"));
  EXPECT_EQ(written["eos_token_id"], json::array({7, 9}));
}

}  // namespace
}  // namespace ulysses::config
