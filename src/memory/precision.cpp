// memory.precision -> parameter dtype (see header).
#include "memory/precision.h"

#include "common/error.h"

namespace ulysses::memory {

c10::ScalarType parameter_dtype(const std::string& precision) {
  if (precision == "fp32") return c10::kFloat;
  if (precision == "bf16") return c10::kBFloat16;
  throw UserError("memory.precision: must be fp32 or bf16, got '" + precision + "'");
}

}  // namespace ulysses::memory
