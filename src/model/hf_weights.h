// HF Llama weights in and out of LlamaForCausalLM: tensors named as transformers names them
// (model.embed_tokens.weight, model.layers.<i>.self_attn.q_proj.weight, ..., lm_head.weight).
#pragma once
#include <ATen/ATen.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "model/llama.h"
#include "model/safetensors.h"

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

// An HF model directory's tensors (the files load_hf_weights reads), for reading element ranges
// of them: ZeRO-3's sharded load, where a rank reads the bytes of its shards and nothing else.
// Construction reads the headers only. Immutable after construction; read() may be called from
// any thread.
class HfWeightIndex {
 public:
  // `params`: the model's parameters (HF name, shape) as named_parameters() lists them; `tied`:
  // model.tie_embeddings. Throws UserError as load_hf_weights does (no weight file, a tensor
  // missing, of the wrong shape, in two files or not a parameter of the model, corrupt headers).
  HfWeightIndex(const std::string& dir,
                const std::vector<std::pair<std::string, std::vector<int64_t>>>& params, bool tied);

  // Writes elements [begin, begin + out.numel()) of tensor `name` (flattened) into `out` ([n],
  // any device and floating dtype; converted from the stored dtype), reading at most a few MiB
  // at a time. Throws UserError when the file cannot be read.
  void read(const std::string& name, int64_t begin, at::Tensor out) const;

 private:
  struct Located {
    std::string file;
    SafetensorsTensor tensor;
  };
  std::map<std::string, Located> tensors_;
};

// The checks of load_hf_weights that need no tensor data, for a run's inputs before any rank
// starts: a directory with PyTorch .bin weights and no safetensors is refused naming them; every
// file the index lists (or model.safetensors, or the *.safetensors found) exists and its header
// parses. Throws UserError("<dir or file>: ..."); reads only headers.
void check_hf_weight_files(const std::string& dir);

// The model's parameters as HF names them, in HF order (lm_head.weight omitted when tied, as HF
// saves it). The tensors are the parameters themselves, detached (same device and dtype).
std::vector<std::pair<std::string, at::Tensor>> hf_state(LlamaForCausalLM& model);

}  // namespace ulysses::model
