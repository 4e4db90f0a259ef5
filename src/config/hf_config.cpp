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

  // Reads object[key] into out when present; REQUIRED keys must be present.
  void read(const char* key, int64_t& out, bool required = false) const {
    if (!required && !has(key)) return;
    const json& value = required ? require(key) : object_[key];
    if (!value.is_number_integer()) fail(key, "expected an integer, got " + value.dump());
    out = value.get<int64_t>();
  }
  void read(const char* key, double& out, bool required = false) const {
    if (!required && !has(key)) return;
    const json& value = required ? require(key) : object_[key];
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

void read_rope_scaling(const json& scaling, const std::string& source, ModelOptions& model) {
  if (!scaling.is_object()) {
    throw UserError(source + ": rope_scaling: expected an object or null, got " + scaling.dump());
  }
  const JsonFields fields(scaling, source, "rope_scaling.");
  std::string type;
  fields.read("type", type);  // older configs
  fields.read("rope_type", type);
  if (type != "llama3") {
    fields.fail("rope_type", "'" + type + "' is not supported (llama3 or no rope_scaling)");
  }
  model.rope_scaling_type = type;
  fields.read("factor", model.rope_scaling_factor, true);
  fields.read("low_freq_factor", model.rope_low_freq_factor, true);
  fields.read("high_freq_factor", model.rope_high_freq_factor, true);
  fields.read("original_max_position_embeddings", model.rope_original_max_position, true);
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
  const ModelFamily& family = model_family(model.family, source + ": model_type");
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
  model.max_position_embeddings = 2048;
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
  fields.read("rope_theta", model.rope_theta);
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
  if (fields.has("rope_scaling")) read_rope_scaling(config["rope_scaling"], source, model);
  // transformers >= 5 writes RoPE as one object, "rope_parameters": {"rope_type": "default" |
  // "llama3", "rope_theta": ..., and llama3's scaling fields}; it wins over the legacy keys.
  if (fields.has("rope_parameters") && !config["rope_parameters"].is_null()) {
    const json& rope = config["rope_parameters"];
    if (!rope.is_object()) {
      throw UserError(source + ": rope_parameters: expected an object, got " + rope.dump());
    }
    const JsonFields rope_fields(rope, source, "rope_parameters.");
    rope_fields.read("rope_theta", model.rope_theta);
    std::string type = "default";
    rope_fields.read("rope_type", type);
    if (type == "default") {
      model.rope_scaling_type.clear();
    } else {
      read_rope_scaling(rope, source, model);
    }
  }
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
  if (!model.rope_scaling_type.empty()) {
    rope_scaling = {{"rope_type", model.rope_scaling_type},
                    {"factor", model.rope_scaling_factor},
                    {"low_freq_factor", model.rope_low_freq_factor},
                    {"high_freq_factor", model.rope_high_freq_factor},
                    {"original_max_position_embeddings", model.rope_original_max_position}};
  }
  const ModelFamily& family = model_family(model.family);
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

}  // namespace ulysses::config
