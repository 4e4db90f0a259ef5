// The WHY.md text (see why.h).
#include "tuner/recommend/why.h"

#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

namespace ulysses::recommend {
namespace {

std::string point_text(const std::string& json) {
  std::string out;
  const nlohmann::ordered_json point = nlohmann::ordered_json::parse(json);
  for (const auto& [key, value] : point.items()) {
    out += (out.empty() ? "" : ", ") + key + "=" + value.get<std::string>();
  }
  return out.empty() ? "(base)" : out;
}

std::string num(double v, const char* format = "%.0f") {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, format, v);
  return buffer;
}

// "compute 81% / comm 12% / offload 3% / optimizer 2%" of the step.
std::string time_split(const store::TrialRecord& t, const std::vector<store::TrialPhase>& phases) {
  const double step = t.step_ms.value_or(0.0);
  if (step <= 0) return "-";
  std::string out;
  for (const char* name : {"compute_ms", "comm_ms", "offload_ms", "optimizer_ms"}) {
    for (const store::TrialPhase& p : phases) {
      if (p.phase != name) continue;
      std::string label(name);
      label.resize(label.size() - 3);
      out += (out.empty() ? "" : " / ") + label + " " + num(100.0 * p.ms / step) + "%";
    }
  }
  return out.empty() ? "-" : out;
}

}  // namespace

std::string render_why(const store::SweepRecord& sweep, const Objective& o,
                       const store::TrialRecord& winner, const std::vector<PointSummary>& summaries,
                       const std::vector<std::vector<store::TrialPhase>>& phases) {
  std::ostringstream md;
  md << "# Why this configuration\n\n";
  md << "Sweep `" << sweep.name << "`, objective **" << o.kind << "**";
  if (o.kind == "throughput") md << " at " << o.target_length << " tokens";
  md << ", memory head-room " << num(100 * o.headroom) << "%.\n\n";
  md << "Winner: trial #" << winner.id << " — " << point_text(winner.point) << ", mesh dp "
     << winner.dp << " x sp " << winner.sp << ", " << winner.seqlen << " tokens, "
     << num(winner.tokens_per_s_per_rank.value_or(0)) << " tokens/s per rank, peak "
     << num(winner.peak_mem_bytes.value_or(0) / 1073741824.0, "%.2f") << " GiB";
  if (winner.limit_bytes) {
    md << " (per-rank limit " << num(*winner.limit_bytes / 1073741824.0, "%.2f") << " GiB";
    // On CPU the limit caps address space above each rank's start-up baseline, while the peak
    // is the rank's whole resident set, libraries included.
    if (!o.check_peak) md << " of address space above the rank's start-up baseline";
    md << ")";
  }
  md << ".\n\n";
  if (o.kind == "max-seqlen") {
    md << "It trains the longest sequence of every configuration tried; among those that reach "
          "the same length it is the fastest.\n\n";
  } else {
    md << "It is the fastest configuration that fits at the target length with the head-room.\n\n";
  }
  md << "## Candidates side by side\n\n";
  md << "| configuration | best trial | length | tokens/s per rank | peak GiB | where time went | "
        "what limited it |\n|---|---:|---:|---:|---:|---|---|\n";
  for (size_t i = 0; i < summaries.size(); ++i) {
    const PointSummary& s = summaries[i];
    md << "| " << point_text(s.point) << " | ";
    if (s.best) {
      md << "#" << s.best->id << " | " << s.best->seqlen << " | "
         << num(s.best->tokens_per_s_per_rank.value_or(0)) << " | "
         << num(s.best->peak_mem_bytes.value_or(0) / 1073741824.0, "%.2f") << " | "
         << time_split(*s.best, phases[i]) << " | ";
    } else {
      md << "- | " << (s.longest_fit ? std::to_string(s.longest_fit) : "-") << " | - | - | - | ";
    }
    md << s.limited_by << " |\n";
  }
  md << "\nLengths are tokens per sequence (the whole sequence, split over sp ranks). "
        "`where time went` is the share of the step in each category of the trial's phases "
        "(metrics.jsonl).\n";
  return md.str();
}

}  // namespace ulysses::recommend
