// Ranking trials and explaining the losers (see ranking.h).
#include "tuner/recommend/ranking.h"

#include <algorithm>
#include <cstdio>
#include <map>

namespace ulysses::recommend {
namespace {

double tps(const store::TrialRecord& t) { return t.tokens_per_s_per_rank.value_or(0.0); }

// true when a is better than b under o (both qualify).
bool better(const store::TrialRecord& a, const store::TrialRecord& b, const Objective& o) {
  if (o.kind == "max-seqlen" && a.seqlen != b.seqlen) return a.seqlen > b.seqlen;
  if (tps(a) != tps(b)) return tps(a) > tps(b);
  return a.id < b.id;
}

std::string fmt(const char* format, double a, double b = 0, double c = 0) {
  char buffer[256];
  std::snprintf(buffer, sizeof buffer, format, a, b, c);
  return buffer;
}

}  // namespace

bool qualifies(const store::TrialRecord& t, const Objective& o) {
  if (t.status != "ok" || t.probe) return false;
  if (o.check_peak && t.limit_bytes && *t.limit_bytes > 0 && t.peak_mem_bytes) {
    return static_cast<double>(*t.peak_mem_bytes) <=
           (1.0 - o.headroom) * static_cast<double>(*t.limit_bytes);
  }
  return true;
}

std::vector<const store::TrialRecord*> rank_trials(const std::vector<store::TrialRecord>& trials,
                                                   const Objective& o) {
  std::vector<const store::TrialRecord*> out;
  for (const store::TrialRecord& t : trials) {
    if (!qualifies(t, o)) continue;
    if (o.kind == "throughput" && t.seqlen != o.target_length) continue;
    out.push_back(&t);
  }
  std::sort(out.begin(), out.end(),
            [&](const store::TrialRecord* a, const store::TrialRecord* b) { return better(*a, *b, o); });
  return out;
}

std::vector<PointSummary> summarize_points(const std::vector<store::TrialRecord>& trials,
                                           const Objective& o, const store::TrialRecord& winner) {
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
    if (relevant && (!s.best || better(t, *s.best, o))) s.best = &t;
  }
  std::vector<PointSummary> out;
  for (auto& [point, s] : by_point) {
    if (point == winner.point) {
      s.limited_by = "the winner";
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
    if (a.best && b.best) return better(*a.best, *b.best, o);
    return a.longest_fit > b.longest_fit;
  });
  return out;
}

}  // namespace ulysses::recommend
