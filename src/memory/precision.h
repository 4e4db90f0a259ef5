// memory.precision: the dtype of parameters and activations, and what the optimizer keeps. bf16
// keeps fp32 master weights and moments in the optimizer (optim/adamw.h); bf16-states keeps bf16
// gradient sums and bf16 moments and no masters (transformers' numerics with a bf16 model and
// torch.optim.AdamW(fused=True)). Both compute the loss, RMSNorm statistics and attention softmax
// in fp32 (model/); the config accepts them only with train.device cuda, while these functions
// and the code paths behind them also work on CPU for unit tests.
#pragma once
#include <c10/core/ScalarType.h>

#include <string>

namespace ulysses::memory {

// "fp32" -> kFloat, "bf16" and "bf16-states" -> kBFloat16. Throws
// UserError("memory.precision: ...") otherwise.
c10::ScalarType parameter_dtype(const std::string& precision);

// Whether gradients are summed and AdamW's moments kept in the parameters' dtype, without master
// weights ("bf16-states"); false for "fp32" and "bf16" (fp32 sums, fp32 masters for bf16).
bool states_in_parameter_dtype(const std::string& precision);

}  // namespace ulysses::memory
