// Tables of trials (see trial_table.h).
#include "tuner/report/trial_table.h"

#include <cstdio>
#include <optional>

#include "tuner/results/format.h"
#include "tuner/results/memory_basis.h"
#include "tuner/results/sweep_analysis.h"

namespace ulysses::report {

std::vector<std::pair<std::string, std::string>> trial_fields(const store::TrialRecord& t) {
  using I = std::optional<int64_t>;
  return {{"id", exact(I(t.id))},
          {"sweep_id", exact(I(t.sweep_id))},
          {"key", t.key},
          {"point", t.point},
          {"config_yaml", t.config_yaml},
          {"config_json", t.config_json},
          {"seqlen", exact(I(t.seqlen))},
          {"probe", t.probe ? "1" : "0"},
          {"world_size", exact(I(t.world_size))},
          {"dp", exact(I(t.dp))},
          {"sp", exact(I(t.sp))},
          {"status", t.status},
          {"exit_code", exact(t.exit_code)},
          {"error", t.error},
          {"reason", t.reason},
          {"started_at", t.started_at},
          {"finished_at", t.finished_at},
          {"wall_s", exact(t.wall_s)},
          {"run_dir", t.run_dir},
          {"step_ms", exact(t.step_ms)},
          {"tokens_per_s", exact(t.tokens_per_s)},
          {"tokens_per_s_per_rank", exact(t.tokens_per_s_per_rank)},
          {"peak_mem_bytes", exact(t.peak_mem_bytes)},
          {"peak_host_bytes", exact(t.peak_host_bytes)},
          {"final_loss", exact(t.final_loss)},
          {"limit_bytes", exact(t.limit_bytes)},
          {"predicted_peak_bytes", exact(t.predicted_peak_bytes)},
          {"predicted_step_ms", exact(t.predicted_step_ms)},
          {"summary", t.summary},
          {"slot", t.slot},
          {"remeasure_of", exact(t.remeasure_of)}};
}

Table trial_fields_table(const std::vector<store::TrialRecord>& trials) {
  Table table;
  for (const auto& [name, value] : trial_fields(store::TrialRecord{})) table.add_column(name);
  for (const auto& trial : trials) {
    std::vector<std::string> row;
    for (auto& [name, value] : trial_fields(trial)) row.push_back(std::move(value));
    table.rows.push_back(std::move(row));
  }
  return table;
}

Table trials_table(const std::vector<store::TrialRecord>& trials) {
  const auto keys = axis_keys(trials);
  Table table;
  table.add_column("id", true);
  table.add_column("status");
  table.add_column("mesh (dp x sp)");
  table.add_column("seqlen", true);
  for (const auto& header : axis_headers(keys)) table.add_column(header);
  // The peak (CPU: RSS) and, where the limit caps something else (CPU: address space), that
  // quantity beside the limit: the limit is compared with the column next to it.
  const bool capped_column = limit_caps_address_space(trials);
  table.add_column("tokens/s per rank", true);
  table.add_column("step ms", true);
  table.add_column(peak_label(trials), true);
  if (capped_column) table.add_column(capped_label(trials), true);
  table.add_column("limit", true);
  table.add_column("error / reason");
  for (const auto& t : trials) {
    std::vector<std::string> row = {std::to_string(t.id), t.status + (t.probe ? " (probe)" : ""),
                                    mesh(t), std::to_string(t.seqlen)};
    for (const auto& key : keys) row.push_back(axis_value(t, key));
    row.push_back(fixed(t.tokens_per_s_per_rank, 1));
    row.push_back(fixed(t.step_ms, 1));
    row.push_back(memory_size(peak_above_baseline(t)));
    if (capped_column) row.push_back(memory_size(capped_peak(t)));
    row.push_back(memory_size(t.limit_bytes));
    row.push_back(t.error.empty() ? t.reason : t.error);
    table.rows.push_back(std::move(row));
  }
  return table;
}

Table best_per_mesh_table(const std::vector<store::TrialRecord>& trials) {
  Table table;
  table.add_column("mesh (dp x sp)");
  table.add_column("trials", true);
  table.add_column("measured", true);
  table.add_column("fastest: tokens/s per rank", true);
  table.add_column("at seqlen", true);
  table.add_column("configuration");
  table.add_column("trial", true);
  table.add_column("longest seqlen", true);
  table.add_column("tokens/s per rank there", true);
  for (const MeshBest& best : best_per_mesh(trials)) {
    std::vector<std::string> row = {best.mesh,
                                    std::to_string(best.trials), std::to_string(best.measured)};
    if (best.fastest) {
      const auto& f = *best.fastest;
      for (auto cell : {fixed(f.tokens_per_s_per_rank, 1), std::to_string(f.seqlen),
                        configuration(f), std::to_string(f.id)}) {
        row.push_back(cell);
      }
      row.push_back(std::to_string(best.longest->seqlen));
      row.push_back(fixed(best.longest->tokens_per_s_per_rank, 1));
    } else {
      row.insert(row.end(), {"-", "-", "no trial measured", "-", "-", "-"});
    }
    table.rows.push_back(std::move(row));
  }
  return table;
}

std::string status_count_text(const std::vector<store::TrialRecord>& trials) {
  std::string out;
  for (const auto& [status, count] : status_counts(trials)) {
    out += (out.empty() ? "" : ", ") + status + " " + std::to_string(count);
  }
  return out.empty() ? "none" : out;
}

Table prediction_table(const std::vector<store::TrialRecord>& trials, bool time_calibrated) {
  auto error = [](double predicted, double measured) {
    char text[32];
    std::snprintf(text, sizeof text, "%+.1f %%", 100.0 * (predicted - measured) / measured);
    return std::string(text);
  };
  Table table;
  table.add_column("id", true);
  table.add_column("mesh");
  table.add_column("seqlen", true);
  table.add_column("probe");
  for (const std::string& name : {peak_label(trials), std::string("predicted peak"),
                                  std::string("error"), std::string("step ms"),
                                  std::string(time_calibrated ? "predicted ms"
                                                              : "predicted ms (uncalibrated)"),
                                  std::string("error ")}) {
    table.add_column(name, true);
  }
  for (const store::TrialRecord& t : trials) {
    if (t.status != "ok" || !(t.predicted_peak_bytes || t.predicted_step_ms)) continue;
    std::vector<std::string> row = {std::to_string(t.id), mesh(t), std::to_string(t.seqlen),
                                    t.probe ? "yes" : "no"};
    const std::optional<int64_t> peak = peak_above_baseline(t);
    const std::optional<int64_t> predicted_peak = above_baseline(t, t.predicted_peak_bytes);
    if (peak && predicted_peak && *peak > 0) {
      const double measured = static_cast<double>(*peak);
      const double predicted = static_cast<double>(*predicted_peak);
      row.insert(row.end(), {memory_size(peak), memory_size(predicted_peak), error(predicted, measured)});
    } else {
      row.insert(row.end(), {"-", "-", "-"});
    }
    if (t.step_ms && t.predicted_step_ms && *t.step_ms > 0) {
      row.insert(row.end(), {fixed(*t.step_ms, 1), fixed(*t.predicted_step_ms, 1),
                             error(*t.predicted_step_ms, *t.step_ms)});
    } else {
      row.insert(row.end(), {"-", "-", "-"});
    }
    table.rows.push_back(row);
  }
  return table;
}

}  // namespace ulysses::report
