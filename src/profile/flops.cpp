// Training FLOPs formula and the peak from the environment (see flops.h).
#include "profile/flops.h"

#include <c10/util/Exception.h>

#include <cstdlib>
#include <string>

#include "common/error.h"

namespace ulysses::profile {

TrainingFlops training_flops(const config::ModelOptions& model, int64_t seq_len) {
  const double h = static_cast<double>(model.hidden_size);
  const double hq = static_cast<double>(model.num_heads);
  const double hkv = static_cast<double>(model.num_kv_heads);
  const double hd = static_cast<double>(model.head_dim > 0 ? model.head_dim
                                                           : model.hidden_size / model.num_heads);
  const double ffn = static_cast<double>(model.intermediate_size);
  const double vocab = static_cast<double>(model.vocab_size);
  const double layers = static_cast<double>(model.num_layers);
  TORCH_CHECK(
      h > 0 && hq > 0 && hkv > 0 && hd > 0 && ffn > 0 && vocab > 0 && layers > 0 && seq_len >= 1,
      "training_flops: shapes must be positive");
  const double per_layer = h * hq * hd           // q_proj
                           + 2.0 * h * hkv * hd  // k_proj, v_proj
                           + hq * hd * h         // o_proj
                           + 3.0 * h * ffn;      // gate_proj, up_proj, down_proj
  TrainingFlops out;
  out.matmul_params = layers * per_layer + vocab * h;  // + lm_head
  out.matmul_per_token = 6.0 * out.matmul_params;
  out.attention_per_token = 6.0 * layers * static_cast<double>(seq_len) * hq * hd;
  return out;
}

double causal_attention_forward_flops(int64_t seq_len, int64_t heads, int64_t head_dim) {
  const double sl = static_cast<double>(seq_len);
  return 2.0 * sl * sl * static_cast<double>(heads) * static_cast<double>(head_dim);
}

double peak_flops_per_rank_from_env() {
  const char* value = std::getenv(kPeakTflopsVariable);
  if (value == nullptr || *value == '\0') return 0.0;
  char* end = nullptr;
  const double tflops = std::strtod(value, &end);
  if (end == value || *end != '\0' || !(tflops > 0.0)) {
    throw UserError(std::string(kPeakTflopsVariable) +
                    ": expected a positive number of TFLOP/s, got '" + value + "'");
  }
  return tflops * 1e12;
}

}  // namespace ulysses::profile
