// memory.precision: the dtype of parameters and activations. bf16 keeps fp32 master
// weights in the optimizer (optim/adamw.h) and computes the loss, RMSNorm statistics and attention
// softmax in fp32 (model/); the config accepts bf16 only with train.device cuda, while this
// function and the code paths behind it also work on CPU for unit tests.
#pragma once
#include <c10/core/ScalarType.h>

#include <string>

namespace ulysses::memory {

// "fp32" -> kFloat, "bf16" -> kBFloat16. Throws UserError("memory.precision: ...") otherwise.
c10::ScalarType parameter_dtype(const std::string& precision);

}  // namespace ulysses::memory
