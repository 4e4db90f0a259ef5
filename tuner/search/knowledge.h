// What the search has learnt about memory so far, and what it implies for points not run
// (the monotonicity rules of engine.h). Facts are (point, length index, fits or not, probe).
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include "tuner/search/space.h"

namespace ulysses::search {

// Invariants: every fact's point belongs to space_; length indices index space_.lengths.
class Knowledge {
 public:
  explicit Knowledge(const Space& space) : space_(space) {}

  void add(const Point& p, int length_index, bool fits, bool probe, int64_t trial_id);

  // A fact implying that `p` does not fit at `length_index` (a real run when probe is false;
  // for a probe, only probe facts count), or nullopt. Returns the implying fact's trial id.
  std::optional<int64_t> implied_oom(const Point& p, int length_index, bool probe) const;
  // A fact implying that `p` fits at `length_index`, or nullopt (real fits imply probe fits).
  std::optional<int64_t> implied_fit(const Point& p, int length_index, bool probe) const;
  // A real measured fit of another point q at exactly `length_index` that p cannot be faster
  // than (cannot_be_faster(p, q): p saves at least as much, and only on axes where that costs
  // time; engine.h), or nullopt.
  std::optional<int64_t> dominating_fit(const Point& p, int length_index) const;

 private:
  struct Fact {
    Point point;
    int length_index;
    bool fits;
    bool probe;
    int64_t trial_id;
  };
  const Space& space_;
  std::vector<Fact> facts_;
};

}  // namespace ulysses::search
