// Key-value tables of the sweep's JSON columns (see summary_tables.h).
#include "tuner/report/summary_tables.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "tuner/experiment/training_data.h"
#include "tuner/results/backend_comparison.h"
#include "tuner/results/format.h"
#include "tuner/results/memory_basis.h"
#include "tuner/results/objective.h"
#include "tuner/results/sweep_analysis.h"
#include "tuner/report/trial_table.h"

namespace ulysses::report {
namespace {

using Json = nlohmann::ordered_json;

std::string scalar_text(const Json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_null()) return "";
  return value.dump();
}

void flatten(const Json& value, const std::string& key, Table& table) {
  if (value.is_object()) {
    for (const auto& [k, v] : value.items()) flatten(v, key.empty() ? k : key + "." + k, table);
  } else if (value.is_array() && std::all_of(value.begin(), value.end(),
                                             [](const Json& v) { return v.is_primitive(); })) {
    std::string joined;
    for (const auto& v : value) joined += (joined.empty() ? "" : ", ") + scalar_text(v);
    table.rows.push_back({key, joined});
  } else if (value.is_array()) {
    for (size_t i = 0; i < value.size(); ++i)
      flatten(value[i], key + "." + std::to_string(i), table);
  } else {
    table.rows.push_back({key, scalar_text(value)});
  }
}

Table key_value_table(const std::string& key_header) {
  Table table;
  table.add_column(key_header);
  table.add_column("value");
  return table;
}

Json parse_object(const std::string& text) {
  Json json = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  return json.is_object() ? json : Json();
}

// "trial 7: dp=1 sp=2 tiled_mlp=4, seqlen 8192, 1234.5 tokens/s per rank".
std::string describe_trial(const SweepData& data, const Json& id) {
  if (!id.is_number_integer()) return scalar_text(id);
  for (const auto& t : data.trials) {
    if (t.id != id.get<int64_t>()) continue;
    std::string text = "trial " + std::to_string(t.id) + ": " + configuration(t) + ", seqlen " +
                       std::to_string(t.seqlen);
    if (t.tokens_per_s_per_rank)
      text += ", " + fixed(t.tokens_per_s_per_rank, 1) + " tokens/s per rank";
    return text;
  }
  return "trial " + id.dump() + " (not in this sweep)";
}

// ("best trial (objective max-seqlen)", the trial rank_trials() puts first). When the sweep's
// experiment cannot be read, the best trial the sweep recorded, saying so.
std::vector<std::string> best_trial_row(const SweepData& data, const Json& summary) {
  try {
    const Objective o = sweep_objective(data.sweep);
    const auto ranked = rank_trials(data.trials, o);
    return {"best trial (objective " + describe(o) + ")",
            ranked.empty() ? "none qualifies" : describe_trial(data, Json(ranked.front()->id))};
  } catch (const UserError& error) {
    const std::string recorded =
        summary.is_object() && summary.contains("best_trial")
            ? describe_trial(data, summary["best_trial"])
            : std::string("none recorded");
    return {"best trial (as the sweep recorded it)",
            recorded + "; the objective is unknown: " + error.what()};
  }
}

}  // namespace

Table json_table(const std::string& json_text, const std::vector<std::string>& skip) {
  Table table = key_value_table("key");
  const Json json = Json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (!json.is_object()) {
    table.rows.push_back({"(not JSON)", json_text});
    return table;
  }
  for (const auto& [key, value] : json.items()) {
    if (std::find(skip.begin(), skip.end(), key) == skip.end()) flatten(value, key, table);
  }
  return table;
}

namespace {

Json stored_data(const SweepData& data) {
  const Json env = Json::parse(data.sweep.environment, nullptr, /*allow_exceptions=*/false);
  return env.is_object() && env.contains("data") ? env["data"] : Json();
}

}  // namespace

std::string data_sentence(const SweepData& data) {
  return experiment::training_data_sentence(stored_data(data));
}

Table document_length_table(const SweepData& data) {
  Table table;
  table.add_column("document length (tokens)");
  table.add_column("documents", /*right=*/true);
  const Json stored = stored_data(data);
  if (!stored.is_object() || !stored.contains("manifest") || !stored["manifest"].is_object()) {
    return table;
  }
  const Json& rows = stored["manifest"].value("document_length_histogram", Json::array());
  for (const Json& row : rows) {
    if (!row.is_object()) continue;
    table.rows.push_back({std::to_string(row.value("min", int64_t{0})) + "-" +
                              std::to_string(row.value("max", int64_t{0})),
                          std::to_string(row.value("documents", int64_t{0}))});
  }
  return table;
}

Table search_summary_table(const SweepData& data) {
  static const std::pair<const char*, const char*> kKnown[] = {
      {"trials_run", "trials run"},
      {"pruned", "pruned by the memory model (not run)"},
      {"skipped", "skipped: outcome known or cannot win (not run)"},
      {"invalid", "invalid configurations (not run)"},
      {"invalid_at_length", "trials invalid at their length only (not run)"},
      {"grid_trials", "trials an exhaustive grid would run"},
      {"best_trial", ""}};  // best_trial_row()
  Table table = key_value_table("quantity");
  const Json summary = parse_object(data.sweep.summary);
  table.rows.push_back({"trials stored, by status", std::to_string(data.trials.size()) + ": " +
                                                        status_count_text(data.trials)});
  if (!summary.is_object()) {
    table.rows.push_back(best_trial_row(data, summary));
    return table;
  }
  std::vector<std::string> known;
  for (const auto& [key, label] : kKnown) {
    known.push_back(key);
    if (key == std::string("best_trial")) {
      table.rows.push_back(best_trial_row(data, summary));
    } else if (summary.contains(key)) {
      table.rows.push_back({label, scalar_text(summary[key])});
    }
  }
  if (summary.contains("trials_run") && summary.contains("grid_trials") &&
      summary["trials_run"].is_number() && summary["grid_trials"].is_number() &&
      summary["grid_trials"].get<double>() > 0) {
    const double run = summary["trials_run"].get<double>();
    const double grid = summary["grid_trials"].get<double>();
    table.rows.push_back({"fraction of the grid run", fixed(100.0 * run / grid, 1) + " %"});
  }
  known.push_back("grid_comparison");
  for (const auto& [key, value] : summary.items()) {
    if (std::find(known.begin(), known.end(), key) == known.end()) flatten(value, key, table);
  }
  return table;
}

Table grid_comparison_table(const SweepData& data) {
  Table table = key_value_table("grid comparison");
  const Json summary = parse_object(data.sweep.summary);
  if (summary.is_object() && summary.contains("grid_comparison")) {
    const Json& grid = summary["grid_comparison"];
    flatten(grid, grid.is_object() ? "" : "grid_comparison", table);
  }
  return table;
}

Table backends_table(const SweepData& data) {
  Table table;
  const std::vector<BackendPair> pairs = backend_pairs(data.trials);
  if (pairs.empty()) return table;
  const std::string peak_name = peak_label(data.trials);  // RSS on CPU
  for (const std::string& name :
       {std::string("row"), std::string("configuration"), std::string("seqlen"),
        std::string("native"), std::string("deepspeed"), std::string("native tok/s/rank"),
        std::string("deepspeed tok/s/rank"), std::string("tok/s ratio"), "native " + peak_name,
        "deepspeed " + peak_name, std::string("peak ratio"), std::string("first loss |diff|"),
        std::string("final loss |diff|")}) {
    table.add_column(name, name != "configuration" && name != "native" && name != "deepspeed");
  }
  auto side = [](const store::TrialRecord* t) {
    if (!t) return std::string("-");
    std::string text = std::to_string(t->id);  // "#12 ok"
    text.insert(0, 1, '#');
    return text + ' ' + t->status;
  };
  auto throughput = [](const store::TrialRecord* t) {
    return t && is_measured(*t) ? fixed(t->tokens_per_s_per_rank, 1) : std::string("-");
  };
  auto peak = [](const store::TrialRecord* t) {
    return t && t->status == "ok" ? memory_size(peak_above_baseline(*t)) : std::string("-");
  };
  auto ratio = [](std::optional<double> r) { return r ? fixed(r, 2) : std::string("-"); };
  auto loss = [](std::optional<double> d) {
    if (!d) return std::string("-");
    char text[32];
    std::snprintf(text, sizeof text, "%.1e", *d);
    return std::string(text);
  };
  int row = 0;
  for (const BackendPair& p : pairs) {
    table.rows.push_back({std::to_string(++row), p.configuration, std::to_string(p.seqlen),
                          side(p.native), side(p.deepspeed), throughput(p.native),
                          throughput(p.deepspeed), ratio(p.throughput_ratio), peak(p.native),
                          peak(p.deepspeed), ratio(p.peak_ratio), loss(p.first_loss_difference),
                          loss(p.final_loss_difference)});
  }
  return table;
}

}  // namespace ulysses::report
