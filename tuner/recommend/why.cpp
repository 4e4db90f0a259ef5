// The WHY.md text (see why.h).
#include "tuner/recommend/why.h"

#include "tuner/experiment/training_data.h"
#include "tuner/results/format.h"
#include "tuner/results/memory_basis.h"
#include "tuner/results/sweep_analysis.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <optional>
#include <sstream>
#include <vector>

namespace ulysses::recommend {
namespace {

std::string num(double v, const char* format = "%.0f") {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, format, v);
  return buffer;
}

// "compute 81% / comm 12% / offload 3% / optimizer 2%" of the step (report::time_breakdown).
std::string time_split(const store::TrialRecord& t, const std::vector<store::TrialPhase>& phases) {
  const double step = t.step_ms.value_or(0.0);
  if (step <= 0) return "-";
  const report::TimeBreakdown b = report::time_breakdown(t, phases);
  return "compute " + num(100.0 * b.compute_ms / step) + "% / comm " +
         num(100.0 * b.comm_ms / step) + "% / offload " + num(100.0 * b.offload_ms / step) +
         "% / optimizer " + num(100.0 * b.optimizer_ms / step) + "%";
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
  md << "Winner: trial #" << winner.id << " — " << report::configuration(winner) << ", "
     << winner.seqlen << " tokens, "
     << num(winner.tokens_per_s_per_rank.value_or(0)) << " tokens/s per rank, "
     << report::peak_against_limit(winner) << ".\n\n";
  if (report::trial_backend(winner) == "deepspeed") {
    md << "Measured on the **deepspeed** backend: transformers under DeepSpeed's Ulysses, ZeRO "
          "and offloads with the `ds_config.json` written here, which is the DeepSpeed config "
          "that ran. `recommended.yaml` and `launch.sh` run the same configuration with "
          "ulysses-train, which this trial did not measure.\n\n";
  } else {
    md << "Measured on the **native** backend (ulysses-train, as `launch.sh` runs it).\n\n";
  }
  const auto env = nlohmann::ordered_json::parse(sweep.environment, nullptr, false);
  md << "Data: "
     << experiment::training_data_sentence(env.is_object() && env.contains("data")
                                               ? env["data"]
                                               : nlohmann::ordered_json())
     << ".\n\n";
  md << report::memory_basis_note({winner});
  if (o.check_peak) {
    md << " A configuration qualifies when that peak stays within " << num(100 * (1 - o.headroom))
       << "% of its limit.";
  } else {
    md << " The trials ran under that limit, the experiment's less the head-room.";
  }
  md << "\n\n";
  if (o.kind == "max-seqlen") {
    md << "It trains the longest sequence of every configuration tried; among those that reach "
          "the same length it is the fastest.\n\n";
  } else {
    md << "It is the fastest configuration that fits at the target length with the head-room.\n\n";
  }
  md << "## Candidates side by side\n\n";
  // The peak (CPU: RSS) and, where the limit caps something else (CPU: address space), that.
  std::vector<store::TrialRecord> best;
  for (const PointSummary& s : summaries) {
    if (s.best) best.push_back(*s.best);
  }
  const bool capped_column = report::limit_caps_address_space(best);
  md << "| configuration | best trial | length | tokens/s per rank | " << report::peak_label(best)
     << " | " << (capped_column ? report::capped_label(best) + " | " : "")
     << "where time went | what limited it |\n|---|---:|---:|---:|---:|"
     << (capped_column ? "---:|" : "") << "---|---|\n";
  for (size_t i = 0; i < summaries.size(); ++i) {
    const PointSummary& s = summaries[i];
    md << "| " << report::configuration(*s.first) << " | ";
    if (s.best) {
      md << "#" << s.best->id << " | " << s.best->seqlen << " | "
         << num(s.best->tokens_per_s_per_rank.value_or(0)) << " | "
         << report::memory_size(report::peak_above_baseline(*s.best)) << " | ";
      if (capped_column) {
        const std::optional<int64_t> capped = report::capped_peak(*s.best);
        md << (capped ? report::memory_size(capped) : std::string("-")) << " | ";
      }
      md << time_split(*s.best, phases[i]) << " | ";
    } else {
      md << "- | " << (s.longest_fit ? std::to_string(s.longest_fit) : "-") << " | - | - | - | "
         << (capped_column ? "- | " : "");
    }
    md << s.limited_by << " |\n";
  }
  md << "\nLengths are tokens per sequence (the whole sequence, split over sp ranks). "
        "`where time went` is the share of the step in each category of the trial's phases "
        "(metrics.jsonl).\n";
  return md.str();
}

}  // namespace ulysses::recommend
