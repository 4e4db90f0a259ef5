// The decoder families as data: what each adds to the Llama block and how transformers names it.
// One implementation (src/model/) reads these flags; nothing else branches on a family's name.
#pragma once
#include <string>

namespace ulysses::config {

struct ModelFamily {
  const char* name;             // model.family, and the HF config.json's model_type
  const char* hf_architecture;  // config.json "architectures": the transformers class
  bool qkv_bias;                // q_proj, k_proj and v_proj carry biases (o_proj never does)
  bool qk_norm;                 // RMSNorm over hd of each query and key head, before RoPE
};

// The family named `name`, by value (four words; a reference returned from a call whose arguments
// are temporaries would read as dangling to GCC 13's -Wdangling-reference at every caller).
// Throws UserError "<key>: '<name>' is not supported (supported: llama, mistral, qwen2, qwen3)"
// for any other name.
ModelFamily model_family(const std::string& name, const std::string& key = "model.family");

// "llama, mistral, qwen2, qwen3": the names model_family accepts.
std::string supported_model_families();

}  // namespace ulysses::config
