// memory.precision -> parameter dtype and optimizer states (see header).
#include "memory/precision.h"

#include "common/error.h"

namespace ulysses::memory {

c10::ScalarType parameter_dtype(const std::string& precision) {
  if (precision == "fp32") return c10::kFloat;
  if (precision == "bf16" || precision == "bf16-states") return c10::kBFloat16;
  throw UserError("memory.precision: must be fp32, bf16 or bf16-states, got '" + precision + "'");
}

bool states_in_parameter_dtype(const std::string& precision) {
  return precision == "bf16-states";
}

}  // namespace ulysses::memory
