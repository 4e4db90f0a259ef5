// HF Llama weights in and out of LlamaForCausalLM: tensors named as transformers names them
// (model.embed_tokens.weight, model.layers.<i>.self_attn.q_proj.weight, ..., lm_head.weight).
#pragma once
#include <ATen/ATen.h>

#include <string>
#include <utility>
#include <vector>

#include "model/llama.h"

namespace ulysses::model {

// Copies the tensors of an HF model directory into `model` (converting dtype and device to the
// parameters'). The files are those listed in <dir>/model.safetensors.index.json ("weight_map")
// when it exists, else <dir>/model.safetensors when it exists (so a training checkpoint's other
// *.safetensors files are not read), else every <dir>/*.safetensors. Every parameter of `model`
// must be found with its shape. Ignored: lm_head.weight when the model ties embeddings, and
// *.rotary_emb.inv_freq. Throws UserError("<dir or file>: ...") when no weight file exists, a
// tensor is missing, has the wrong shape, appears twice, or is not a parameter of the model (e.g.
// more layers than model.num_layers), and for corrupt files.
void load_hf_weights(LlamaForCausalLM& model, const std::string& dir);

// The checks of load_hf_weights that need no tensor data, for a run's inputs before any rank
// starts: a directory with PyTorch .bin weights and no safetensors is refused naming them; every
// file the index lists (or model.safetensors, or the *.safetensors found) exists and its header
// parses. Throws UserError("<dir or file>: ..."); reads only headers.
void check_hf_weight_files(const std::string& dir);

// The model's parameters as HF names them, in HF order (lm_head.weight omitted when tied, as HF
// saves it). The tensors are the parameters themselves, detached (same device and dtype).
std::vector<std::pair<std::string, at::Tensor>> hf_state(LlamaForCausalLM& model);

}  // namespace ulysses::model
