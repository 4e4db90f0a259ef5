// The memory model the sweep prunes with (SPEC 7 "Cost model", first part): a LOWER BOUND on the
// peak memory of one rank, from terms that every configuration must hold at once. Pruning with a
// lower bound never drops a configuration that would fit; the calibrated full model (every
// working set, allocator overhead) refines it later. Each term's formula is written beside it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "config/options.h"

namespace ulysses::costmodel {

struct MemoryTerm {
  std::string name;     // "weights", "gradients", ...
  int64_t bytes = 0;
  std::string formula;  // how it was computed, for reports
};

struct MemoryEstimate {
  std::vector<MemoryTerm> terms;
  int64_t total_bytes() const;
};

// Parameters of the model (embeddings, every layer, final norm, LM head unless tied).
int64_t parameter_count(const config::ModelOptions& m);

// Lower bound of one rank's peak memory for a validated run config with world = dp * sp ranks.
// On CPU (train.device cpu) host memory is the device: offloads move nothing out of it.
MemoryEstimate lower_bound_peak(const config::RunConfig& c);

}  // namespace ulysses::costmodel
