// The tiny run the cost-model tests compute by hand, shared by costmodel_test.cpp (a Llama) and
// costmodel_family_test.cpp (the same shapes in another family).
#pragma once
#include <string>

#include "config/run_config.h"

namespace ulysses::costmodel::testing {

// h 8, L 2, hq 2, hkv 1, hd 4, ffn 16, V 32, sl 16 over sp 2 (T = 8 local tokens, the KV head
// replicated), tiled MLP and loss, fp32 on CPU; validated for a world of 2.
inline config::RunConfig tiny_run(const std::string& family = "llama") {
  config::RunConfig c;
  c.model.family = family;
  c.model.hidden_size = 8, c.model.num_layers = 2, c.model.num_heads = 2;
  c.model.num_kv_heads = 1, c.model.head_dim = 4, c.model.intermediate_size = 16;
  c.model.vocab_size = 32, c.model.bos_token_id = 1, c.model.eos_token_id = 2;
  c.mesh.sp = 2, c.mesh.dp = 1;
  c.sequence.length = 16;
  c.memory.tiled_mlp.value = 2;
  c.memory.tiled_loss.value = 2;
  c.train.device = "cpu";
  config::validate(c, 2);
  return c;
}

}  // namespace ulysses::costmodel::testing
