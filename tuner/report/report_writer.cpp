// The markdown report (see report_writer.h).
#include "tuner/report/report_writer.h"

#include <algorithm>

#include "tuner/results/backend_comparison.h"
#include "tuner/results/format.h"
#include "tuner/results/machine_load.h"
#include "tuner/results/memory_basis.h"
#include "tuner/report/summary_tables.h"
#include "tuner/results/sweep_analysis.h"
#include "tuner/report/trial_table.h"

namespace ulysses::report {
namespace {

std::string code(const std::string& text) {
  return text.find('`') == std::string::npos ? "`" + text + "`" : "``" + text + "``";
}

std::string sweep_table(const SweepData& data) {
  const auto& s = data.sweep;
  Table table;
  table.add_column("sweep");
  table.add_column(s.name);
  table.rows = {
      {"id", std::to_string(s.id)},
      {"experiment", s.experiment_path.empty() ? "-" : code(s.experiment_path)},
      {"status", s.status},
      {"created (UTC)", s.created_at},
      {"finished (UTC)", s.finished_at.empty() ? "-" : s.finished_at},
      {"search", s.search},
      {"objective", s.objective},
      {"trials", std::to_string(data.trials.size()) + ": " + status_count_text(data.trials)},
      {"machine load while trials ran", machine_load_text(data.loads)}};
  return render_markdown(table);
}

// The trials on the Pareto front of the measured ones (pareto_front()), shortest first.
Table pareto_table(const std::vector<store::TrialRecord>& trials) {
  std::vector<LengthThroughput> points;
  for (const store::TrialRecord& t : trials) {
    if (is_measured(t)) points.push_back({t.seqlen, *t.tokens_per_s_per_rank, t.id});
  }
  Table table;
  table.add_column("trial", true);
  table.add_column("seqlen", true);
  table.add_column("tokens/s per rank", true);
  table.add_column("configuration");
  for (const LengthThroughput& p : pareto_front(points)) {
    for (const store::TrialRecord& t : trials) {
      if (t.id != p.trial_id) continue;
      table.rows.push_back({std::to_string(t.id), std::to_string(t.seqlen),
                            fixed(t.tokens_per_s_per_rank, 1), configuration(t)});
    }
  }
  return table;
}

std::string plots_section(const SweepData& data, const std::vector<Plot>& plots) {
  std::string out = "## Plots\n\n";
  const char* captions[] = {
      "Tokens/s per rank of every measured trial (status `ok`, not a memory probe), one line per "
      "mesh and configuration.",
      "",  // the memory plot's own (plot_script.h: what it draws depends on the trials)
      "Median ms per step of each measured trial by category (trial_phases `compute_ms`, "
      "`comm_ms`, `offload_ms`, `optimizer_ms`); other = step ms minus their sum (0 when the "
      "phases overlap).",
      "Every measured trial in the plane of sequence length and throughput; the Pareto front "
      "holds the trials no other trial beats in both:"};
  for (size_t i = 0; i < plots.size(); ++i) {
    if (plots[i].file == "backends.png") continue;  // in "Ours vs DeepSpeed"
    out += "### " + plots[i].title + "\n\n";
    if (plots[i].omitted.empty()) {
      out += "![" + plots[i].title + "](" + plots[i].file + ")\n\n";
      const std::string caption = !plots[i].caption.empty() ? plots[i].caption
                                  : i < std::size(captions) ? std::string(captions[i])
                                                            : std::string();
      if (!caption.empty()) out += caption + "\n\n";
      if (plots[i].file == "pareto_front.png") {
        out += render_markdown(pareto_table(data.trials)) + "\n";
      }
    } else {
      out += plots[i].omitted + "\n\n";
    }
  }
  return out;
}

// Ours against DeepSpeed, side by side, with the workarounds the deepspeed trials applied.
std::string backends_section(const SweepData& data, const Table& table,
                             const std::vector<Plot>& plots) {
  std::string out =
      "## Ours vs DeepSpeed\n\n"
      "Each configuration at each length as `ulysses-train` (backend `native`) and as "
      "transformers under DeepSpeed's Ulysses, ZeRO and offloads (backend `deepspeed`, the "
      "`ds_config.json` `ulysses-tune export --format deepspeed` writes for it) ran it, on the "
      "same weights and tokens. Ratios are deepspeed / native; a tokens/s ratio below 1 means "
      "ours is faster, a peak ratio above 1 that ours needs less memory. Peaks are above each "
      "backend's own start-up baseline (see Memory above). Loss differences are of the first "
      "and the last step; on the same weights (`model.load`) they are rounding, with freshly "
      "initialised weights the two backends start from different ones.\n\n" +
      render_markdown(table) + "\n";
  std::vector<std::string> applied;
  for (const store::TrialRecord& t : data.trials) {
    for (const std::string& w : workarounds(t)) {
      if (std::find(applied.begin(), applied.end(), w) == applied.end()) applied.push_back(w);
    }
  }
  if (!applied.empty()) {
    out += "The deepspeed trials worked around these pitfalls of DeepSpeed's own code, keeping "
           "the loss both backends define:\n\n";
    for (const std::string& w : applied) out += "- " + w + "\n";
    out += "\n";
  }
  for (const Plot& p : plots) {
    if (p.file != "backends.png") continue;
    out += p.omitted.empty() ? "![" + p.title + "](" + p.file + ")\n\n" : p.omitted + "\n\n";
  }
  return out;
}

}  // namespace

std::string render_readme(const SweepData& data, const std::vector<Plot>& plots,
                          const std::string& command) {
  std::string out = "# Sweep " + code(data.sweep.name) + "\n\nMade with " + code(command) +
                    ". Every trial, every column: [trials.csv](trials.csv).\n\n";
  out += sweep_table(data) + "\n";
  out += "**Memory.** " + memory_basis_note(data.trials) + "\n\n";

  out += "## Environment\n\n";
  const Table environment = json_table(data.sweep.environment, {"data"});
  out += environment.rows.empty() ? "No environment was recorded.\n\n"
                                  : render_markdown(environment) + "\n";
  out += "## Data\n\nThe trials trained on " + data_sentence(data) + ".\n\n";
  if (const Table lengths = document_length_table(data); !lengths.rows.empty()) {
    out += "Document lengths, from the data's manifest:\n\n" + render_markdown(lengths) + "\n";
  }

  out += "## Search summary\n\n" + render_markdown(search_summary_table(data)) + "\n";
  const Table grid = grid_comparison_table(data);
  if (!grid.rows.empty()) {
    out += "### Comparison with the exhaustive grid\n\n" + render_markdown(grid) + "\n";
  }

  out += "## Fastest and longest per mesh\n\n";
  if (data.trials.empty()) {
    out += "The sweep has no trials.\n\n";
  } else {
    out += "Measured trials only (status `ok`, not memory probes); tokens/s per rank. The best "
           "trial is the objective's pick (search summary above).\n\n" +
           render_markdown(best_per_mesh_table(data.trials)) + "\n";
  }

  const Table backends = backends_table(data);
  if (!backends.rows.empty()) out += backends_section(data, backends, plots);

  out += plots_section(data, plots);
  out +=
      "Plot data: `throughput.dat`, `memory.dat`, `phases.dat`, `pareto.dat`, `prediction.dat`, "
      "`backends.dat` (those with data); "
      "redraw with `gnuplot plots.gp` in this directory.\n\n";

  const Table predictions = prediction_table(data.trials, data.time_calibrated);
  if (!predictions.rows.empty()) {
    out += "## Cost model: predicted vs measured\n\n"
           "Each measured trial (status `ok`) beside the cost model's prediction stored before it "
           "ran (`trials.predicted_peak_bytes`, `predicted_step_ms`; tuner/costmodel/): peak per "
           "rank, both above the start-up baseline (see Memory above), and step time; error = "
           "(predicted - measured) / measured. `ulysses-tune plan --fit` recalibrates the model "
           "on these trials.\n\n";
    out += data.time_calibrated
               ? "The step-time predictions came from a cost-model fit stored in this database "
                 "before the sweep started.\n\n"
               : "**The step-time predictions are uncalibrated**: no cost-model fit was stored "
                 "in this database when the sweep started, so they come from the hardware "
                 "profile's peak throughputs at assumed efficiencies and can be far off (on a CPU "
                 "they can be several times too fast). `ulysses-tune plan --fit` on these trials "
                 "stores a fit that later sweeps and `plan --db` use.\n\n";
    out += render_markdown(predictions) + "\n";
  }

  out += "## Trials\n\n";
  if (data.trials.empty()) {
    out += "The sweep has no trials.\n";
  } else {
    out +=
        std::string(limit_caps_address_space(data.trials)
                        ? "Peaks (above the start-up baseline, see Memory above: on CPU the RSS, "
                          "and beside it the address space, which is what the limit caps) and "
                          "the limit are per rank"
                        : "Peak (above the start-up baseline, see Memory above) and limit are "
                          "per rank") +
        "; a probe is a memory probe run (`attention.skip_all_but_last`).\n\n" +
        render_markdown(trials_table(data.trials));
  }

  if (!data.sweep.experiment_yaml.empty()) {
    out += "\n<details><summary>Experiment file</summary>\n\n````yaml\n" +
           data.sweep.experiment_yaml + (data.sweep.experiment_yaml.back() == '\n' ? "" : "\n") +
           "````\n\n</details>\n";
  }
  return out;
}

}  // namespace ulysses::report
