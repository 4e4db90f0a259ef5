// Explaining the losers of a ranking (see ranking.h).
#include "tuner/recommend/ranking.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>

namespace ulysses::recommend {
namespace {

double tps(const store::TrialRecord& t) { return t.tokens_per_s_per_rank.value_or(0.0); }

std::string fmt(const char* format, double a, double b = 0, double c = 0) {
  char buffer[256];
  std::snprintf(buffer, sizeof buffer, format, a, b, c);
  return buffer;
}

}  // namespace

std::vector<PointSummary> summarize_points(const std::vector<store::TrialRecord>& trials,
                                           const Objective& o, const store::TrialRecord& winner,
                                           const StepsByTrial& steps) {
  static const std::vector<store::TrialStep> kNone;
  auto steps_of = [&](const store::TrialRecord& t) -> const std::vector<store::TrialStep>& {
    const auto it = steps.find(t.id);
    return it == steps.end() ? kNone : it->second;
  };
  std::map<std::string, PointSummary> by_point;
  std::map<std::string, std::string> not_run;  // point -> a pruned/skipped/invalid reason
  for (const store::TrialRecord& t : trials) {
    PointSummary& s = by_point[t.point];
    s.point = t.point;
    if (!s.first) s.first = &t;
    if (t.status == "invalid" || t.status == "pruned" || t.status == "skipped") {
      not_run.emplace(t.point, t.status + ": " + t.reason);
      continue;
    }
    if (t.status == "oom" && (s.first_oom == 0 || t.seqlen < s.first_oom)) {
      s.first_oom = t.seqlen, s.oom_trial = t.id;
    }
    if (!qualifies(t, o)) continue;
    s.longest_fit = std::max(s.longest_fit, t.seqlen);
    const bool relevant = o.kind == "max-seqlen" || t.seqlen == o.target_length;
    if (relevant && (!s.best || report::ranks_before(t, *s.best, o))) s.best = &t;
  }
  std::vector<PointSummary> out;
  for (auto& [point, s] : by_point) {
    if (point == winner.point) {
      s.limited_by = "the winner";
    } else if (s.best && s.best->seqlen == winner.seqlen &&
               tied(*s.best, steps_of(*s.best), winner, steps_of(winner))) {
      s.tied_with_winner = true;
      const StepRange a = *measured_range(*s.best, steps_of(*s.best));
      const StepRange w = *measured_range(winner, steps_of(winner));
      s.limited_by = fmt("tied with the winner: %.0f vs %.0f tokens/s per rank", tps(*s.best),
                         tps(winner)) +
                     fmt(" is inside the spread of their measured steps (%.0f-%.0f", a.slowest,
                         a.fastest) +
                     fmt(" vs %.0f-%.0f); the winner is first only by its median", w.slowest,
                         w.fastest);
    } else if (s.best && s.best->seqlen == winner.seqlen) {
      s.limited_by = fmt("slower: %.0f vs %.0f tokens/s per rank (%.1f%% less)", tps(*s.best),
                         tps(winner), 100.0 * (1.0 - tps(*s.best) / std::max(tps(winner), 1e-9)));
    } else if (s.first_oom > 0 && (o.kind == "max-seqlen" || s.first_oom <= o.target_length)) {
      s.limited_by = "out of memory at " + std::to_string(s.first_oom) + " tokens (trial #" +
                     std::to_string(s.oom_trial) + ")";
      if (s.longest_fit > 0) s.limited_by += "; longest fit " + std::to_string(s.longest_fit);
    } else if (auto it = not_run.find(point); it != not_run.end()) {
      s.limited_by = it->second;
    } else if (s.best) {
      s.limited_by = "longest fit " + std::to_string(s.longest_fit) + " < " +
                     std::to_string(winner.seqlen);
    } else {
      s.limited_by = "no qualifying trial (failed, timed out, or over the head-room)";
    }
    out.push_back(s);
  }
  std::stable_sort(out.begin(), out.end(), [&](const PointSummary& a, const PointSummary& b) {
    if ((a.point == winner.point) != (b.point == winner.point)) return a.point == winner.point;
    if ((a.best != nullptr) != (b.best != nullptr)) return a.best != nullptr;
    if (a.best && b.best) return report::ranks_before(*a.best, *b.best, o);
    return a.longest_fit > b.longest_fit;
  });
  return out;
}

std::optional<StepRange> measured_range(const store::TrialRecord& t,
                                        const std::vector<store::TrialStep>& steps) {
  if (!t.step_ms || !(*t.step_ms > 0) || !t.tokens_per_s_per_rank) return std::nullopt;
  size_t first = 0;  // the warm-up steps come first
  const nlohmann::json summary = nlohmann::json::parse(t.summary, nullptr, false);
  if (summary.is_object() && summary.contains("measured_steps") &&
      summary["measured_steps"].is_number_integer()) {
    const auto measured = summary["measured_steps"].get<int64_t>();
    if (measured > 0 && static_cast<size_t>(measured) <= steps.size()) {
      first = steps.size() - static_cast<size_t>(measured);
    }
  }
  std::optional<StepRange> range;
  for (size_t i = first; i < steps.size(); ++i) {
    if (!(steps[i].step_ms > 0)) continue;  // NaN or 0: no time
    const double value = *t.tokens_per_s_per_rank * *t.step_ms / steps[i].step_ms;
    if (!range) range = StepRange{value, value};
    range->slowest = std::min(range->slowest, value);
    range->fastest = std::max(range->fastest, value);
  }
  return range;
}

bool tied(const store::TrialRecord& a, const std::vector<store::TrialStep>& a_steps,
          const store::TrialRecord& b, const std::vector<store::TrialStep>& b_steps) {
  const std::optional<StepRange> ra = measured_range(a, a_steps), rb = measured_range(b, b_steps);
  return ra && rb && ra->slowest <= rb->fastest && rb->slowest <= ra->fastest;
}

}  // namespace ulysses::recommend
