// `ulysses-tune list` / `show`: sweeps and trials as terminal tables and field lists.
#include "tuner/report/list_show_command.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/error.h"
#include "tuner/results/format.h"
#include "tuner/results/machine_load.h"
#include "tuner/results/memory_basis.h"
#include "tuner/results/objective.h"
#include "tuner/report/summary_tables.h"
#include "tuner/results/sweep_analysis.h"
#include "tuner/results/sweep_source.h"
#include "tuner/report/trial_table.h"
#include "tuner/store/sweep_store.h"

namespace ulysses::report {
namespace {

constexpr size_t kMaxCell = 60;  // terminal tables cut long cells (errors) here

// "name: value", or "name:" and the value's lines indented when it has several.
void print_field(std::ostream& out, const std::string& name, const std::string& value) {
  if (value.find('\n') == std::string::npos) {
    out << name << ": " << value << "\n";
    return;
  }
  out << name << ":\n";
  size_t begin = 0;
  while (begin < value.size()) {
    size_t end = value.find('\n', begin);
    if (end == std::string::npos) end = value.size();
    out << "    " << value.substr(begin, end - begin) << "\n";
    begin = end + 1;
  }
}

// `text` broken into lines of at most `width` characters at spaces (a longer word stays whole).
std::string wrap(const std::string& text, size_t width) {
  std::string out, line;
  std::istringstream words(text);
  for (std::string word; words >> word;) {
    if (!line.empty() && line.size() + 1 + word.size() > width) {
      out += line + "\n";
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
  }
  return out + line + "\n";
}

std::string pretty_json(const std::string& text) {
  const auto json = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  return json.is_discarded() ? text : json.dump(2);
}

// (objective, best trial) cells of a sweep: "max-seqlen", "7: 4096 tokens, 812.3 tokens/s per
// rank" (rank_trials() first, "-" when none qualifies); "?" and "experiment unreadable" when the
// sweep's experiment cannot be read.
std::pair<std::string, std::string> best_trial_cells(
    const store::SweepRecord& sweep, const std::vector<store::TrialRecord>& trials) {
  Objective o;
  try {
    o = sweep_objective(sweep);
  } catch (const UserError&) {
    return {sweep.objective + "?", "experiment unreadable"};
  }
  const auto ranked = rank_trials(trials, o);
  if (ranked.empty()) return {describe(o), "-"};
  const store::TrialRecord& best = *ranked.front();
  return {describe(o), std::to_string(best.id) + ": " + std::to_string(best.seqlen) +
                           " tokens, " + fixed(best.tokens_per_s_per_rank, 1) +
                           " tokens/s per rank"};
}

Table sweeps_table(store::Database& db) {
  store::SweepStore store(db);
  std::vector<std::pair<store::SweepRecord, std::vector<store::TrialRecord>>> sweeps;
  std::vector<store::TrialRecord> all;
  for (const auto& sweep : store.sweeps()) {
    sweeps.emplace_back(sweep, store.trials(sweep.id));
    all.insert(all.end(), sweeps.back().second.begin(), sweeps.back().second.end());
  }
  const auto statuses = status_counts(all);  // the columns: statuses that occur anywhere
  Table table;
  table.add_column("id", true);
  for (const char* name : {"name", "created", "status"}) table.add_column(name);
  table.add_column("trials", true);
  for (const auto& [status, count] : statuses) table.add_column(status, true);
  table.add_column("objective");
  table.add_column("best trial");
  for (const auto& [sweep, trials] : sweeps) {
    std::vector<std::string> row = {std::to_string(sweep.id), sweep.name, sweep.created_at,
                                    sweep.status, std::to_string(trials.size())};
    for (const auto& [status, total] : statuses) {
      row.push_back(std::to_string(std::count_if(trials.begin(), trials.end(),
                                                 [&](auto& t) { return t.status == status; })));
    }
    const auto [objective, best] = best_trial_cells(sweep, trials);
    row.push_back(objective);
    row.push_back(best);
    table.rows.push_back(std::move(row));
  }
  return table;
}

// "address space 100 MiB (above its start-up size) of a per-rank limit of 110 MiB (RSS 46 MiB
// above its start-up RSS); peak_mem_bytes 170 MiB above the start-up baseline 124 MiB": the peak
// against the limit on the basis the limit caps (memory_basis.h), then what the store holds.
std::string peak_text(const store::TrialRecord& t) {
  if (!t.peak_mem_bytes) return "-";
  return peak_against_limit(t) + "; peak_mem_bytes " + memory_size(t.peak_mem_bytes) + " " +
         trial_basis(t);
}

void show_trial(store::Database& db, int64_t id, std::ostream& out) {
  const std::string missing = "--trial " + std::to_string(id) + ": no such trial in " + db.path();
  if (!has_sweep_tables(db)) throw UserError(missing + " (it holds no sweeps)");
  store::SweepStore store(db);
  const auto trial = store.trial(id);
  if (!trial) throw UserError(missing);
  const auto sweep = store.sweep(trial->sweep_id);
  out << "trial " << id << " of sweep " << (sweep ? sweep->name : "?") << "\n";
  for (const auto& [name, value] : trial_fields(*trial)) print_field(out, name, value);
  print_field(out, "mesh", mesh(*trial));
  print_field(out, "peak", peak_text(*trial));
  std::string beside;
  for (const auto& n : store.trial_neighbours(trial->sweep_id)) {
    if (n.trial_id == id) beside += (beside.empty() ? "" : ", ") + std::to_string(n.neighbour_id);
  }
  if (!trial->slot.empty() || !beside.empty()) {
    print_field(out, "ran beside", beside.empty() ? "no other trial" : "trials " + beside);
  }
  if (trial->predicted_step_ms) {
    const bool calibrated = sweep && time_predictions_calibrated(db, *sweep);
    print_field(out, "predicted step",
                fixed(trial->predicted_step_ms, 1) + " ms" +
                    (calibrated ? " (from a cost-model fit)"
                                : " (uncalibrated: no cost-model fit was stored when the sweep "
                                  "started; see plan --fit)"));
  }

  Table steps;
  steps.add_column("step", true);
  for (const std::string& name : {std::string("loss"), std::string("grad_norm"),
                                  std::string("step ms"), std::string("tokens/s"),
                                  peak_label({*trial})}) {
    steps.add_column(name, true);
  }
  for (const auto& s : store.trial_steps(id)) {
    steps.rows.push_back({std::to_string(s.step), fixed(s.loss, 4), fixed(s.grad_norm, 4),
                          fixed(s.step_ms, 2), fixed(s.tokens_per_s, 1),
                          memory_size(above_baseline(*trial, s.peak_mem_bytes))});
  }
  out << "\nsteps:\n" << (steps.rows.empty() ? "(none recorded)\n" : render_terminal(steps));
  Table phases;
  phases.add_column("phase");
  phases.add_column("ms per step", true);
  for (const auto& p : store.trial_phases(id)) phases.rows.push_back({p.phase, fixed(p.ms, 3)});
  out << "\nphases:\n" << (phases.rows.empty() ? "(none recorded)\n" : render_terminal(phases));
  out << "\nrun dir: " << (trial->run_dir.empty() ? "(none)" : trial->run_dir) << "\n";
}

void show_sweep(store::Database& db, const std::string& name, std::ostream& out) {
  const SweepData data = load_sweep(db, name);
  const auto& s = data.sweep;
  out << "sweep " << s.name << "\n";
  for (const auto& [field, value] :
       std::vector<std::pair<std::string, std::string>>{{"id", std::to_string(s.id)},
                                                        {"created_at", s.created_at},
                                                        {"finished_at", s.finished_at},
                                                        {"status", s.status},
                                                        {"experiment_path", s.experiment_path},
                                                        {"search", s.search},
                                                        {"objective", s.objective}}) {
    print_field(out, field, value);
  }
  print_field(out, "trials",
              std::to_string(data.trials.size()) + ": " + status_count_text(data.trials));
  print_field(out, "machine load while trials ran", machine_load_text(data.loads));
  print_field(out, "data", data_sentence(data));
  out << "\nenvironment:\n" << render_terminal(json_table(s.environment, {"data"}));
  out << "\nsearch summary:\n" << render_terminal(search_summary_table(data));
  const Table grid = grid_comparison_table(data);
  if (!grid.rows.empty()) out << "\n" << render_terminal(grid);
  out << "\n";
  print_field(out, "summary (JSON)", pretty_json(s.summary));
  if (!s.experiment_yaml.empty()) print_field(out, "experiment_yaml", s.experiment_yaml);
}

}  // namespace

CLI::App* add_list_command(CLI::App& app, ListOptions* options) {
  CLI::App* cmd =
      app.add_subcommand("list", "List the sweeps of a results database, or a sweep's trials");
  cmd->add_option("--db", options->db_path, "results database (read only)")->capture_default_str();
  cmd->add_option("--sweep", options->sweep, "list this sweep's trials");
  return cmd;
}

CLI::App* add_show_command(CLI::App& app, ShowOptions* options) {
  CLI::App* cmd =
      app.add_subcommand("show", "Show one trial (--trial ID) or one sweep (--sweep NAME) in full");
  cmd->add_option("--db", options->db_path, "results database (read only)")->capture_default_str();
  cmd->add_option("--trial", options->trial_id, "trial id (as `list --sweep` shows)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--sweep", options->sweep, "sweep name");
  return cmd;
}

int run_list(const ListOptions& options, std::ostream& out) {
  store::Database db = open_results(options.db_path);
  if (!options.sweep.empty()) {
    const SweepData data = load_sweep(db, options.sweep);
    out << "sweep " << data.sweep.name << " (id " << data.sweep.id << ", " << data.sweep.status
        << "): " << data.trials.size() << " trials: " << status_count_text(data.trials) << "\n";
    if (!data.trials.empty()) {
      out << render_terminal(trials_table(data.trials), kMaxCell)
          << wrap(memory_basis_note(data.trials), 100);
    }
    return 0;
  }
  if (!has_sweep_tables(db) || store::SweepStore(db).sweeps().empty()) {
    out << options.db_path << ": no sweeps\n";
    return 0;
  }
  out << render_terminal(sweeps_table(db), kMaxCell);
  return 0;
}

int run_show(const ShowOptions& options, std::ostream& out) {
  if ((options.trial_id != 0) == !options.sweep.empty()) {
    throw UserError("show: give one of --trial ID and --sweep NAME");
  }
  store::Database db = open_results(options.db_path);
  if (options.trial_id != 0) {
    show_trial(db, options.trial_id, out);
  } else {
    show_sweep(db, options.sweep, out);
  }
  return 0;
}

}  // namespace ulysses::report
