// Hugging Face config.json <-> ModelOptions for the supported families (config/model_family.h).
// Reading serves `model.load: DIR`; writing serves checkpoints, whose config.json must load in
// transformers (AutoModelForCausalLM: LlamaForCausalLM, Qwen2ForCausalLM, ...).
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "config/options.h"

namespace ulysses::config {

// ModelOptions from an HF config object. Keys read: model_type (family; absent = llama),
// hidden_size, num_hidden_layers, num_attention_heads, intermediate_size, vocab_size (required);
// num_key_value_heads (default num_attention_heads), head_dim (default 0 = hidden_size /
// num_attention_heads; 128 for qwen3, as Qwen3Config), sliding_window (mistral: null = none,
// absent = 4096; qwen2/qwen3: only with use_sliding_window and when a layer gets the window by
// layer_types or max_window_layers), rope_theta
// (10000), rms_norm_eps (1e-6), tie_word_embeddings (false), initializer_range,
// max_position_embeddings, bos_token_id, eos_token_id (first of a list), rope_scaling (null or
// {rope_type: llama3, factor, low_freq_factor, high_freq_factor,
// original_max_position_embeddings}). Fields HF does not know (init_seed, preset, load) keep
// their ModelOptions defaults. `source` names the file in errors.
// Throws UserError "<source>: <key>: <what>" for a missing required key or a wrong type, and
// "<source>: <key>: ... not supported" for a model_type not supported (the message lists the
// supported ones), rope types other than llama3, hidden_act other than silu, or attention_bias /
// mlp_bias true (biases beyond Qwen2's q/k/v).
ModelOptions model_options_from_hf_config(const nlohmann::json& config, const std::string& source);

// Reads <model_dir>/config.json with model_options_from_hf_config and sets `load` = model_dir.
// Throws UserError "<model_dir>/config.json: cannot read file" / "...: invalid JSON (...)".
ModelOptions read_hf_config(const std::string& model_dir);

// The config.json of a checkpoint in its family's layout: architectures (e.g. ["Qwen3ForCausalLM"])
// and model_type from the family, every shape field, rope_scaling (null when rope_scaling_type is
// ""), hidden_act "silu", the family's own keys (llama: attention_bias/mlp_bias false; mistral:
// sliding_window; qwen2/qwen3: use_sliding_window, sliding_window, max_window_layers), bos/eos ids,
// and torch_dtype (the dtype of the saved weights: "float32" or "bfloat16"). head_dim 0 is written
// resolved (hidden_size / num_heads).
// REQUIRES: model.num_heads >= 1; model.family one of the supported families.
nlohmann::json to_hf_config_json(const ModelOptions& model,
                                 const std::string& torch_dtype = "float32");

}  // namespace ulysses::config
