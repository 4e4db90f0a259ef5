// The table of decoder families (see model_family.h).
#include "config/model_family.h"

#include <array>

#include "common/error.h"

namespace ulysses::config {
namespace {

// Llama 2/3.x and Mistral are the plain block; Qwen2/2.5 adds q/k/v biases; Qwen3 drops them and
// normalizes each q and k head instead (its head_dim is given, not hidden_size / num_heads).
constexpr std::array<ModelFamily, 4> kFamilies = {{
    {"llama", "LlamaForCausalLM", /*qkv_bias=*/false, /*qk_norm=*/false},
    {"mistral", "MistralForCausalLM", false, false},
    {"qwen2", "Qwen2ForCausalLM", true, false},
    {"qwen3", "Qwen3ForCausalLM", false, true},
}};

}  // namespace

ModelFamily model_family(const std::string& name, const std::string& key) {
  for (const ModelFamily& family : kFamilies) {
    if (name == family.name) return family;
  }
  throw UserError(key + ": '" + name + "' is not supported (supported: " +
                  supported_model_families() + ")");
}

std::string supported_model_families() {
  std::string names;
  for (const ModelFamily& family : kFamilies) {
    names += (names.empty() ? "" : ", ") + std::string(family.name);
  }
  return names;
}

}  // namespace ulysses::config
