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
// max_position_embeddings (the family's config class default: llama 2048, mistral 131072, qwen2
// and qwen3 32768), bos_token_id, eos_token_id (first of a list), and RoPE as the installed
// transformers (5.x) reads it: the legacy `rope_scaling` object when it is non-empty, else
// `rope_parameters`; in it rope_theta (wins over the top-level key), rope_type (or the older
// `type`; default | linear | dynamic | yarn | llama3) and the type's keys: factor (linear,
// dynamic, yarn, llama3; yarn's may be null = max_position_embeddings /
// original_max_position_embeddings), low_freq_factor and high_freq_factor (llama3),
// original_max_position_embeddings (yarn, llama3; a top-level key of that name wins; default
// max_position_embeddings), attention_factor, beta_fast, beta_slow, mscale, mscale_all_dim and
// truncate (yarn; absent, null or 0 as transformers takes them). Fields HF does not know
// (init_seed, preset, load) keep their ModelOptions defaults. `source` names the file in errors.
// Throws UserError "<source>: <key>: <what>" for a missing required key or a wrong type, and
// "<source>: <key>: ... not supported" for a model_type not supported (the message lists the
// supported ones), another rope type (longrope, ...), RoPE per layer type, a
// partial_rotary_factor other than 1 with scaling, hidden_act other than silu, or attention_bias /
// mlp_bias true (biases beyond Qwen2's q/k/v).
ModelOptions model_options_from_hf_config(const nlohmann::json& config, const std::string& source);

// Reads <model_dir>/config.json with model_options_from_hf_config and sets `load` = model_dir.
// Throws UserError "<model_dir>/config.json: cannot read file" / "...: invalid JSON (...)".
ModelOptions read_hf_config(const std::string& model_dir);

// The config.json of a checkpoint in its family's layout: architectures (e.g. ["Qwen3ForCausalLM"])
// and model_type from the family, every shape field, rope_theta and rope_scaling (null when
// rope_scaling_type is "", else rope_type and the keys transformers reads for that type, so that
// it computes the same frequencies), hidden_act "silu", the family's own keys (llama:
// attention_bias/mlp_bias false; mistral: sliding_window; qwen2/qwen3: use_sliding_window,
// sliding_window, max_window_layers), bos/eos ids, and torch_dtype (the dtype of the saved
// weights: "float32" or "bfloat16"). head_dim 0 is written resolved (hidden_size / num_heads).
// REQUIRES: model.num_heads >= 1; model.family one of the supported families.
nlohmann::json to_hf_config_json(const ModelOptions& model,
                                 const std::string& torch_dtype = "float32");

// For a checkpoint of a model loaded from an HF directory: puts into `config` (to_hf_config_json of
// `model`) the bos_token_id and eos_token_id of `source` (that directory's config.json) as they
// are there (null stays null, a list stays a list, an absent key stays absent) where `model`'s
// id is the one model_options_from_hf_config reads from `source`, i.e. the run config did not set
// another (one that did is written as set); and the source's pad_token_id as it is. Throws what
// model_options_from_hf_config throws for `source` (named `source_name`).
void keep_source_token_ids(const nlohmann::json& source, const std::string& source_name,
                           const ModelOptions& model, nlohmann::json& config);

}  // namespace ulysses::config
