// Implications of measured fits and out-of-memory results (see knowledge.h).
#include "tuner/search/knowledge.h"

namespace ulysses::search {

void Knowledge::add(const Point& p, int length_index, bool fits, bool probe, int64_t trial_id) {
  facts_.push_back({p, length_index, fits, probe, trial_id});
}

std::optional<int64_t> Knowledge::implied_oom(const Point& p, int length_index, bool probe) const {
  for (const Fact& f : facts_) {
    // A probe needs no more memory than the real run: a probe OOM implies a real OOM, but a
    // real OOM says nothing about a probe.
    if (f.fits || (probe && !f.probe)) continue;
    if (length_index >= f.length_index && saves_at_least(space_, f.point, p)) return f.trial_id;
  }
  return std::nullopt;
}

std::optional<int64_t> Knowledge::implied_fit(const Point& p, int length_index, bool probe) const {
  for (const Fact& f : facts_) {
    if (!f.fits || (!probe && f.probe)) continue;
    if (length_index <= f.length_index && saves_at_least(space_, p, f.point)) return f.trial_id;
  }
  return std::nullopt;
}

std::optional<int64_t> Knowledge::dominating_fit(const Point& p, int length_index) const {
  for (const Fact& f : facts_) {
    if (!f.fits || f.probe || f.length_index != length_index || f.point == p) continue;
    if (cannot_be_faster(space_, p, f.point)) return f.trial_id;
  }
  return std::nullopt;
}

}  // namespace ulysses::search
