// Pure functions over a sweep's trials (see sweep_analysis.h).
#include "tuner/results/sweep_analysis.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <tuple>

#include "tuner/results/format.h"

namespace ulysses::report {
namespace {

bool shown_elsewhere(const std::string& key) {
  return key == "mesh.dp" || key == "mesh.sp" || key == "sequence.length";
}

std::string value_text(const nlohmann::ordered_json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_null()) return "";
  return value.dump();
}

}  // namespace

bool is_measured(const TrialRecord& trial) {
  return trial.status == "ok" && !trial.probe && trial.tokens_per_s_per_rank.has_value() &&
         !std::isnan(*trial.tokens_per_s_per_rank);
}

std::vector<std::pair<std::string, std::string>> axis_values(const TrialRecord& trial) {
  const auto point =
      nlohmann::ordered_json::parse(trial.point, nullptr, /*allow_exceptions=*/false);
  if (!point.is_object()) return {{"point", trial.point}};
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [key, value] : point.items()) {
    if (!shown_elsewhere(key)) out.emplace_back(key, value_text(value));
  }
  return out;
}

std::vector<std::string> axis_keys(const std::vector<TrialRecord>& trials) {
  std::vector<std::string> keys;
  for (const auto& trial : trials) {
    for (const auto& [key, value] : axis_values(trial)) {
      if (std::find(keys.begin(), keys.end(), key) == keys.end()) keys.push_back(key);
    }
  }
  return keys;
}

std::vector<std::string> axis_headers(const std::vector<std::string>& keys) {
  auto last = [](const std::string& key) { return key.substr(key.rfind('.') + 1); };
  std::vector<std::string> out;
  for (const auto& key : keys) {
    const auto same = std::count_if(keys.begin(), keys.end(),
                                    [&](const std::string& k) { return last(k) == last(key); });
    out.push_back(same > 1 ? key : last(key));
  }
  return out;
}

std::string axis_value(const TrialRecord& trial, const std::string& key) {
  for (const auto& [k, value] : axis_values(trial)) {
    if (k == key) return value;
  }
  return "";
}

std::string configuration(const TrialRecord& trial, const std::string& except) {
  std::string out =
      "dp=" + std::to_string(trial.dp) + " sp=" + std::to_string(trial.sp) + mesh_split(trial);
  std::vector<std::string> keys;
  for (const auto& [key, value] : axis_values(trial)) keys.push_back(key);
  const auto headers = axis_headers(keys);
  const auto values = axis_values(trial);
  for (size_t i = 0; i < values.size(); ++i) {
    if (values[i].first != except) out += " " + headers[i] + "=" + values[i].second;
  }
  return out;
}

std::string trial_backend(const TrialRecord& trial) {
  const std::string backend = axis_value(trial, "backend");
  return backend.empty() ? "native" : backend;
}

std::vector<std::pair<std::string, int>> status_counts(const std::vector<TrialRecord>& trials) {
  std::vector<std::pair<std::string, int>> out;
  for (const char* status : store::kTrialStatuses) out.emplace_back(status, 0);
  for (const auto& trial : trials) {
    auto it = std::find_if(out.begin(), out.end(),
                           [&](const auto& e) { return e.first == trial.status; });
    if (it == out.end()) it = out.insert(out.end(), {trial.status, 0});
    ++it->second;
  }
  std::erase_if(out, [](const auto& e) { return e.second == 0; });
  return out;
}

std::vector<MeshBest> best_per_mesh(const std::vector<TrialRecord>& trials) {
  std::map<std::tuple<int64_t, int64_t, std::string>, MeshBest> by_mesh;  // (sp, dp, split)
  for (const auto& trial : trials) {
    MeshBest& best = by_mesh[{trial.sp, trial.dp, mesh_split(trial)}];
    best.dp = trial.dp;
    best.sp = trial.sp;
    best.mesh = mesh(trial);
    ++best.trials;
    if (!is_measured(trial)) continue;
    ++best.measured;
    const double tps = *trial.tokens_per_s_per_rank;
    if (!best.fastest || tps > *best.fastest->tokens_per_s_per_rank) best.fastest = trial;
    if (!best.longest || trial.seqlen > best.longest->seqlen ||
        (trial.seqlen == best.longest->seqlen && tps > *best.longest->tokens_per_s_per_rank)) {
      best.longest = trial;
    }
  }
  std::vector<MeshBest> out;
  for (auto& [mesh, best] : by_mesh) out.push_back(std::move(best));
  return out;
}

TimeBreakdown time_breakdown(const TrialRecord& trial, const std::vector<TrialPhase>& phases) {
  TimeBreakdown b;
  for (const auto& phase : phases) {
    if (phase.phase == "compute_ms") b.compute_ms = phase.ms;
    if (phase.phase == "comm_ms") b.comm_ms = phase.ms;
    if (phase.phase == "offload_ms") b.offload_ms = phase.ms;
    if (phase.phase == "optimizer_ms") b.optimizer_ms = phase.ms;
  }
  const double known = b.compute_ms + b.comm_ms + b.offload_ms + b.optimizer_ms;
  b.other_ms = std::max(0.0, trial.step_ms.value() - known);
  return b;
}

std::vector<LengthThroughput> pareto_front(std::vector<LengthThroughput> points) {
  std::erase_if(points,
                [](const LengthThroughput& p) { return std::isnan(p.tokens_per_s_per_rank); });
  // Longest first; on equal length the fastest first; on a full tie the lowest id first.
  std::sort(points.begin(), points.end(), [](const LengthThroughput& a, const LengthThroughput& b) {
    if (a.seqlen != b.seqlen) return a.seqlen > b.seqlen;
    if (a.tokens_per_s_per_rank != b.tokens_per_s_per_rank)
      return a.tokens_per_s_per_rank > b.tokens_per_s_per_rank;
    return a.trial_id < b.trial_id;
  });
  // A point survives when it is faster than every longer-or-equal point before it.
  std::vector<LengthThroughput> front;
  for (const auto& p : points) {
    if (front.empty() || p.tokens_per_s_per_rank > front.back().tokens_per_s_per_rank) {
      front.push_back(p);
    }
  }
  std::reverse(front.begin(), front.end());
  return front;
}

}  // namespace ulysses::report
