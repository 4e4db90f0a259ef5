// HF Llama config.json reading and writing (nlohmann-json).
#include "config/hf_config.h"

#include <c10/util/Exception.h>

#include "common/error.h"
#include "common/input_file.h"
#include "config/model_family.h"

using nlohmann::json;

namespace ulysses::config {
namespace {

// Typed access to one object's keys, with errors "<source>: <key>: <what>".
class JsonFields {
 public:
  JsonFields(const json& object, std::string source, std::string prefix = "")
      : object_(object), source_(std::move(source)), prefix_(std::move(prefix)) {}

  bool has(const char* key) const { return object_.contains(key) && !object_[key].is_null(); }

  [[noreturn]] void fail(const char* key, const std::string& what) const {
    throw UserError(source_ + ": " + prefix_ + key + ": " + what);
  }

  const json& require(const char* key) const {
    if (!has(key)) fail(key, "missing (required for a decoder model)");
    return object_[key];
  }
  // object[key], checked to be present when REQUIRED (the caller has checked it otherwise).
  const json& field(const char* key, bool required) const {
    if (required) return require(key);
    return object_[key];
  }

  // Reads object[key] into out when present; REQUIRED keys must be present.
  void read(const char* key, int64_t& out, bool required = false) const {
    if (!required && !has(key)) return;
    const json& value = field(key, required);
    if (!value.is_number_integer()) fail(key, "expected an integer, got " + value.dump());
    out = value.get<int64_t>();
  }
  void read(const char* key, double& out, bool required = false) const {
    if (!required && !has(key)) return;
    const json& value = field(key, required);
    if (!value.is_number()) fail(key, "expected a number, got " + value.dump());
    out = value.get<double>();
  }
  void read(const char* key, bool& out) const {
    if (!has(key)) return;
    if (!object_[key].is_boolean()) fail(key, "expected true or false, got " + object_[key].dump());
    out = object_[key].get<bool>();
  }
  void read(const char* key, std::string& out) const {
    if (!has(key)) return;
    if (!object_[key].is_string()) fail(key, "expected a string, got " + object_[key].dump());
    out = object_[key].get<std::string>();
  }

 private:
  const json& object_;
  std::string source_;
  std::string prefix_;
};

// Scaling types whose frequencies the rotary embedding computes (model/rotary.h).
bool known_rope_type(const std::string& type) {
  return type == "linear" || type == "dynamic" || type == "yarn" || type == "llama3";
}

// RoPE as transformers (>= 5, modeling_rope_utils.py) reads it from config.json: the RoPE object is
// a non-empty legacy `rope_scaling` when there is one, else `rope_parameters`
// (convert_rope_params_to_dict: `rope_scaling or rope_parameters`); in it, `rope_theta` and
// `partial_rotary_factor` win over the top-level keys, `rope_type` over the older `type`
// ("default" when neither); for yarn and llama3 a top-level `original_max_position_embeddings`
// wins over the object's (standardize_rope_params), which defaults to max_position_embeddings.
// Reads max_position_embeddings from `model` (read before this).
void read_rope(const json& config, const JsonFields& top, const std::string& source,
               ModelOptions& model) {
  top.read("rope_theta", model.rope_theta);
  model.rope_scaling_type.clear();
  const char* key = nullptr;
  for (const char* candidate : {"rope_scaling", "rope_parameters"}) {
    if (!top.has(candidate)) continue;
    const json& value = config[candidate];
    if (!value.is_object()) {
      top.fail(candidate, "expected an object or null, got " + value.dump());
    }
    if (!value.empty()) {
      key = candidate;
      break;
    }
  }
  if (key == nullptr) return;  // default RoPE
  const json& rope = config[key];
  const JsonFields fields(rope, source, std::string(key) + ".");
  for (const char* layer_type : {"full_attention", "sliding_attention"}) {
    if (rope.contains(layer_type)) {
      fields.fail(layer_type, "RoPE parameters per layer type are not supported (one object for "
                              "every layer)");
    }
  }
  fields.read("rope_theta", model.rope_theta);
  std::string type = "default";
  fields.read("type", type);  // older configs
  fields.read("rope_type", type);
  if (type == "default") return;
  if (!known_rope_type(type)) {
    fields.fail(rope.contains("rope_type") ? "rope_type" : "type",
                "'" + type + "' is not supported (default, linear, dynamic, yarn or llama3)");
  }
  double partial_rotary_factor = 1.0;
  top.read("partial_rotary_factor", partial_rotary_factor);
  fields.read("partial_rotary_factor", partial_rotary_factor);
  if (partial_rotary_factor != 1.0) {
    fields.fail("partial_rotary_factor",
                "RoPE on part of the head dim is not supported with " + type + " scaling");
  }
  model.rope_scaling_type = type;
  auto original_max_position = [&] {
    model.rope_original_max_position = model.max_position_embeddings;
    fields.read("original_max_position_embeddings", model.rope_original_max_position);
    top.read("original_max_position_embeddings", model.rope_original_max_position);
  };
  if (type == "llama3") {
    fields.read("factor", model.rope_scaling_factor, true);
    fields.read("low_freq_factor", model.rope_low_freq_factor, true);
    fields.read("high_freq_factor", model.rope_high_freq_factor, true);
    original_max_position();
  } else if (type == "yarn") {
    original_max_position();
    if (fields.has("factor")) {
      fields.read("factor", model.rope_scaling_factor);
    } else if (rope.contains("factor")) {  // null: the ratio of the context lengths, as HF
      model.rope_scaling_factor = static_cast<double>(model.max_position_embeddings) /
                                  static_cast<double>(model.rope_original_max_position);
    } else {
      fields.require("factor");
    }
    model.rope_attention_factor = 0.0;  // absent or null: from the factor and mscale
    fields.read("attention_factor", model.rope_attention_factor);
    if (fields.has("attention_factor") && !(model.rope_attention_factor > 0)) {
      fields.fail("attention_factor", "must be > 0, got " + rope["attention_factor"].dump());
    }
    // HF takes `beta_fast or 32`, `beta_slow or 1`: null and 0 mean the defaults.
    model.rope_beta_fast = 32.0;
    model.rope_beta_slow = 1.0;
    fields.read("beta_fast", model.rope_beta_fast);
    fields.read("beta_slow", model.rope_beta_slow);
    if (model.rope_beta_fast == 0) model.rope_beta_fast = 32.0;
    if (model.rope_beta_slow == 0) model.rope_beta_slow = 1.0;
    model.rope_mscale = 0.0;  // HF uses them only when both are set and non-zero
    model.rope_mscale_all_dim = 0.0;
    fields.read("mscale", model.rope_mscale);
    fields.read("mscale_all_dim", model.rope_mscale_all_dim);
    // HF: rope_parameters.get("truncate", True); a null is falsy there, so no truncation.
    model.rope_truncate = !rope.contains("truncate") || !rope["truncate"].is_null();
    fields.read("truncate", model.rope_truncate);
  } else {  // linear, dynamic
    fields.read("factor", model.rope_scaling_factor, true);
  }
}

// The window a layer of the model attends within, as transformers reads the config: Mistral's
// applies to every layer whenever it is not null (v0.3 and Nemo write null); Qwen's only with
// use_sliding_window, and then to the layers that layer_types names "sliding_attention", or
// without that key to layers max_window_layers and up. Both default to 4096 when the key is
// absent, as transformers' config classes do. 0 = no layer has a window.
int64_t sliding_window_of(const JsonFields& fields, const json& config, const std::string& family,
                          int64_t num_layers) {
  if (family == "llama") return 0;
  bool use_sliding_window = family == "mistral";
  fields.read("use_sliding_window", use_sliding_window);
  if (!use_sliding_window) return 0;
  int64_t window = config.contains("sliding_window") ? 0 : 4096;
  fields.read("sliding_window", window);
  if (family == "mistral" || window == 0) return window;
  if (config.contains("layer_types") && config["layer_types"].is_array()) {
    for (const json& type : config["layer_types"]) {
      if (type == "sliding_attention") return window;
    }
    return 0;
  }
  int64_t max_window_layers = 28;  // Qwen2Config's and Qwen3Config's default
  fields.read("max_window_layers", max_window_layers);
  return max_window_layers < num_layers ? window : 0;
}

}  // namespace

ModelOptions model_options_from_hf_config(const json& config, const std::string& source) {
  if (!config.is_object()) throw UserError(source + ": expected a JSON object");
  const JsonFields fields(config, source);
  ModelOptions model;
  fields.read("model_type", model.family);  // absent: llama, as older Llama configs
  const ModelFamily family = model_family(model.family, source + ": model_type");
  std::string text;
  fields.read("hidden_act", text);
  if (!text.empty() && text != "silu") {
    fields.fail("hidden_act", "'" + text + "' is not supported (silu only)");
  }
  // Qwen2's q/k/v biases are implied by its model_type; an attention_bias key (Llama, Qwen3) puts
  // a bias on o_proj too, which no supported family has.
  for (const char* bias : {"attention_bias", "mlp_bias"}) {
    bool has_bias = false;
    fields.read(bias, has_bias);
    if (has_bias) {
      fields.fail(bias, std::string("true is not supported (") + family.name +
                            (family.qkv_bias ? " has biases on q/k/v only)" : " has no biases)"));
    }
  }

  model.rms_norm_eps = 1.0e-6;  // HF LlamaConfig's defaults where they differ from ours
  // The family's config class default when the key is absent (it decides yarn's and llama3's
  // original_max_position_embeddings and dynamic scaling when those are absent too).
  model.max_position_embeddings = model.family == "llama"     ? 2048
                                  : model.family == "mistral" ? 4096 * 32
                                                              : 32768;  // Qwen2Config, Qwen3Config
  fields.read("hidden_size", model.hidden_size, true);
  fields.read("num_hidden_layers", model.num_layers, true);
  model.sliding_window = sliding_window_of(fields, config, model.family, model.num_layers);
  fields.read("num_attention_heads", model.num_heads, true);
  model.num_kv_heads = model.num_heads;
  fields.read("num_key_value_heads", model.num_kv_heads);
  model.head_dim = model.family == "qwen3" ? 128 : 0;  // Qwen3Config's default is 128, not h / hq
  fields.read("head_dim", model.head_dim);
  fields.read("intermediate_size", model.intermediate_size, true);
  fields.read("vocab_size", model.vocab_size, true);
  fields.read("rms_norm_eps", model.rms_norm_eps);
  fields.read("tie_word_embeddings", model.tie_embeddings);
  fields.read("initializer_range", model.init_std);
  fields.read("max_position_embeddings", model.max_position_embeddings);
  fields.read("bos_token_id", model.bos_token_id);
  if (fields.has("eos_token_id") && config["eos_token_id"].is_array()) {
    const json& ids = config["eos_token_id"];
    if (ids.empty() || !ids[0].is_number_integer()) {
      fields.fail("eos_token_id", "expected an integer or a list of integers, got " + ids.dump());
    }
    model.eos_token_id = ids[0].get<int64_t>();
  } else {
    fields.read("eos_token_id", model.eos_token_id);
  }
  read_rope(config, fields, source, model);
  return model;
}

ModelOptions read_hf_config(const std::string& model_dir) {
  const std::string path = model_dir + "/config.json";
  const std::string text = read_input_file(path, "a JSON file");
  json config;
  try {
    config = json::parse(text);
  } catch (const json::parse_error& e) {
    throw UserError(path + ": invalid JSON (" + e.what() + ")");
  }
  ModelOptions model = model_options_from_hf_config(config, path);
  model.load = model_dir;
  return model;
}

json to_hf_config_json(const ModelOptions& model, const std::string& torch_dtype) {
  TORCH_CHECK(model.num_heads >= 1, "to_hf_config_json: num_heads must be >= 1");
  const int64_t head_dim =
      model.head_dim > 0 ? model.head_dim : model.hidden_size / model.num_heads;
  json rope_scaling = nullptr;
  const std::string& type = model.rope_scaling_type;
  if (!type.empty()) {  // the keys transformers' _validate_<type>_rope_parameters expects
    rope_scaling = {{"rope_type", type}, {"factor", model.rope_scaling_factor}};
    if (type == "llama3") {
      rope_scaling.update({{"low_freq_factor", model.rope_low_freq_factor},
                           {"high_freq_factor", model.rope_high_freq_factor},
                           {"original_max_position_embeddings", model.rope_original_max_position}});
    } else if (type == "yarn") {
      rope_scaling.update({{"original_max_position_embeddings", model.rope_original_max_position},
                           {"beta_fast", model.rope_beta_fast},
                           {"beta_slow", model.rope_beta_slow}});
      // Left out when unset: transformers derives the same attention factor without them.
      if (model.rope_attention_factor > 0) {
        rope_scaling["attention_factor"] = model.rope_attention_factor;
      }
      if (model.rope_mscale != 0) rope_scaling["mscale"] = model.rope_mscale;
      if (model.rope_mscale_all_dim != 0) {
        rope_scaling["mscale_all_dim"] = model.rope_mscale_all_dim;
      }
      if (!model.rope_truncate) rope_scaling["truncate"] = false;  // absent = true
    }
  }
  const ModelFamily family = model_family(model.family);
  json config{
      {"architectures", json::array({family.hf_architecture})},
      {"model_type", family.name},
      {"hidden_size", model.hidden_size},
      {"intermediate_size", model.intermediate_size},
      {"num_hidden_layers", model.num_layers},
      {"num_attention_heads", model.num_heads},
      {"num_key_value_heads", model.num_kv_heads},
      {"head_dim", head_dim},
      {"vocab_size", model.vocab_size},
      {"max_position_embeddings", model.max_position_embeddings},
      {"rope_theta", model.rope_theta},
      {"rope_scaling", rope_scaling},
      {"rms_norm_eps", model.rms_norm_eps},
      {"tie_word_embeddings", model.tie_embeddings},
      {"hidden_act", "silu"},
      {"attention_dropout", 0.0},
      {"initializer_range", model.init_std},
      {"bos_token_id", model.bos_token_id},
      {"eos_token_id", model.eos_token_id},
      {"torch_dtype", torch_dtype},
      {"use_cache", true},
  };
  const json window = model.sliding_window > 0 ? json(model.sliding_window) : json(nullptr);
  if (model.family == "llama") {
    config.update({{"attention_bias", false}, {"mlp_bias", false}, {"pretraining_tp", 1}});
  } else if (model.family == "mistral") {
    config["sliding_window"] = window;
  } else {  // qwen2, qwen3: the window is off unless use_sliding_window
    config.update({{"use_sliding_window", model.sliding_window > 0},
                   {"sliding_window", window},
                   // A window applies to layers max_window_layers and up: to all, or to none.
                   {"max_window_layers", model.sliding_window > 0 ? 0 : model.num_layers}});
    if (model.family == "qwen3") config["attention_bias"] = false;
  }
  return config;
}

void keep_source_token_ids(const json& source, const std::string& source_name,
                           const ModelOptions& model, json& config) {
  const ModelOptions read = model_options_from_hf_config(source, source_name);
  auto keep = [&](const char* key, bool unchanged) {
    if (!unchanged) return;  // the run config set another id: write the run's
    if (source.contains(key)) {
      config[key] = source[key];
    } else {
      config.erase(key);  // absent stays absent: transformers applies its family default
    }
  };
  keep("bos_token_id", model.bos_token_id == read.bos_token_id);
  keep("eos_token_id", model.eos_token_id == read.eos_token_id);
  keep("pad_token_id", true);  // not a run-config key: always the source's
}

}  // namespace ulysses::config
