// What a profiled scope spends its time on: the NVTX category of its range and the
// bucket its exclusive time is summed into in the step's metrics.
#pragma once
#include <cstdint>
#include <string_view>

namespace ulysses::profile {

// Values are the NVTX category ids in domain "ulysses" (0 = no category). kNone scopes are
// transparent for the per-category split: their time stays with the enclosing scope.
enum class Category : uint32_t {
  kNone = 0,
  kCompute = 1,    // forward, backward, attention, MLP, loss
  kComm = 2,       // all-to-all, gradient all-reduce, other collectives
  kOffload = 3,    // host <-> device copies of offloaded activations
  kOptimizer = 4,  // clipping + AdamW step
};

inline constexpr Category kAllCategories[] = {Category::kCompute, Category::kComm,
                                              Category::kOffload, Category::kOptimizer};

// "compute" | "comm" | "offload" | "optimizer" | "none".
constexpr const char* category_name(Category category) {
  switch (category) {
    case Category::kCompute:
      return "compute";
    case Category::kComm:
      return "comm";
    case Category::kOffload:
      return "offload";
    case Category::kOptimizer:
      return "optimizer";
    case Category::kNone:
      break;
  }
  return "none";
}

// The category of a scope known by its phase name alone, so that ScopedPhase("a2a") needs no
// second argument: a2a, ring, grad_sync, all_reduce, all_gather, broadcast, barrier -> kComm;
// optimizer -> kOptimizer; names starting with "offload" -> kOffload; anything else -> kCompute.
constexpr Category default_category(std::string_view name) {
  for (std::string_view comm :
       {"a2a", "ring", "grad_sync", "all_reduce", "all_gather", "broadcast", "barrier"})
    if (name == comm) return Category::kComm;
  if (name == "optimizer") return Category::kOptimizer;
  if (name.substr(0, 7) == "offload") return Category::kOffload;
  return Category::kCompute;
}

}  // namespace ulysses::profile
