// `ulysses-tune recommend` / `export`: pick the winner, write it for every consumer (see
// recommend_command.h).
#include "tuner/recommend/recommend_command.h"

#include <CLI/CLI.hpp>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <set>

#include "common/error.h"
#include "common/output_dir.h"
#include "common/paths.h"
#include "config/run_config.h"
#include "config/yaml_values.h"
#include "tuner/experiment/experiment.h"
#include "tuner/export/accelerate_config.h"
#include "tuner/export/arctic_recipe.h"
#include "tuner/export/deepspeed_config.h"
#include "tuner/export/export_common.h"
#include "tuner/export/export_files.h"
#include "tuner/launch/launch_plan.h"
#include "tuner/launch/sbatch.h"
#include "tuner/recommend/numerics_check.h"
#include "tuner/recommend/ranking.h"
#include "tuner/results/sweep_analysis.h"
#include "tuner/recommend/why.h"
#include "tuner/results/sweep_source.h"
#include "tuner/store/store.h"
#include "tuner/store/sweep_store.h"

namespace ulysses::recommend {
namespace {

namespace fs = std::filesystem;

void write_file(const fs::path& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  if (!out.flush()) throw UserError(path.string() + ": cannot write");
}

// The winner's run config as the tuned job runs it: the base run config's length of training
// and warmup, no probe, output into runs/<sweep>-tuned.
config::RunConfig tuned_config(const store::TrialRecord& t, const experiment::Experiment& e,
                               const std::string& sweep_name) {
  const config::RunConfig base = config::parse_run_config_yaml(e.base_yaml);
  return config::parse_run_config_yaml(
      t.config_yaml, {"train.steps=" + std::to_string(base.train.steps),
                      "profile.warmup_steps=" + std::to_string(base.profile.warmup_steps),
                      "attention.skip_all_but_last=false",
                      "memory.limit_gib=" + config::format_double(e.memory_limit_gib),
                      "output.dir=runs/" + sweep_name + "-tuned"});
}

std::string launch_script(const config::RunConfig& c, const store::SweepRecord& sweep,
                          const store::TrialRecord& t) {
  const int world = static_cast<int>(c.mesh.dp * c.mesh.sp);
  launch::LaunchOptions o;
  o.config_path = "recommended.yaml";
  o.nproc = world;
  std::string text =
      "#!/usr/bin/env bash\n"
      "# The configuration `ulysses-tune recommend` picked from sweep '" + sweep.name +
      "' (trial #" + std::to_string(t.id) +
      "). Expects ulysses-tune and ulysses-train on PATH (build/bin).\n"
      "# The run's outputs go under the directory it is started from (output.dir, relative).\n"
      "set -euo pipefail\nhere=$(dirname \"$0\")\n\n"
      "# This machine, " + std::to_string(world) + " local ranks (extra arguments: --set k=v):\n"
      "exec ulysses-tune launch \"$here/recommended.yaml\" --nproc " + std::to_string(world) +
      " \"$@\"\n\n";
  o.print = "torchrun";
  text += "# torchrun, one node of " + std::to_string(world) + " ranks:\n";
  for (const std::string& line : launch::cluster_command_lines(o, "ulysses-train")) {
    text += "#   " + line + "\n";
  }
  o.print = "srun";
  text += "# SLURM, inside an allocation (or submit launch.sbatch: sbatch launch.sbatch):\n";
  for (const std::string& line : launch::cluster_command_lines(o, "ulysses-train")) {
    text += "#   " + line + "\n";
  }
  return text;
}

// launch.sbatch: the srun line of launch.sh as a batch job of one node, reading `config_path`
// (absolute: SLURM runs a copy of the script); outputs go under the directory it is submitted from.
std::string sbatch_script(const config::RunConfig& c, const store::SweepRecord& sweep,
                          const std::string& config_path) {
  const int world = static_cast<int>(c.mesh.dp * c.mesh.sp);
  launch::LaunchOptions o;
  o.config_path = config_path;
  o.nproc = world;
  o.print = "srun";
  launch::SbatchJob job;
  job.job_name = "ulysses-" + sweep.name + "-tuned";
  job.ntasks_per_node = world;
  if (c.train.device == "cuda") job.gpus_per_node = world;  // one GPU per rank
  job.comments = {"The recommended configuration from sweep '" + sweep.name +
                  "' as a SLURM job: sbatch " + shell_quote(
                      (fs::path(config_path).parent_path() / "launch.sbatch").string()) +
                  " (the run's outputs go under the directory it is submitted from)."};
  job.body = {"cd \"${SLURM_SUBMIT_DIR:-.}\""};
  for (const std::string& line : launch::cluster_command_lines(o, "ulysses-train")) {
    job.body.push_back(line);
  }
  return launch::sbatch_script(job);
}

// Why the numerics check cannot run on this sweep's winner `t`, "" when it can: it runs
// ulysses-train, so the trials must have been measured with it.
std::string check_not_run_reason(const store::SweepRecord& sweep, const store::TrialRecord& t) {
  if (report::trial_backend(t) != "native") {
    return "trial #" + std::to_string(t.id) + " was measured on the " + report::trial_backend(t) +
           " backend, and the check compares ulysses-train runs";
  }
  const auto env = nlohmann::json::parse(sweep.environment, nullptr, false);
  std::string version = env.is_object() && env.contains("trainer_version") &&
                                env["trainer_version"].is_string()
                            ? env["trainer_version"].get<std::string>()
                            : std::string();
  version = version.substr(0, version.find('\n'));
  if (version.rfind("ulysses-train", 0) != 0) {
    return "the sweep's trials were not run by ulysses-train (its trainer reported '" + version +
           "')";
  }
  return "";
}

// Writes the checks that ran into the database (table numerics_checks), one transaction.
void store_checks(const std::string& db_path, int64_t sweep_id,
                  const std::vector<NumericsCheck>& checks) {
  store::Store store = store::Store::open(db_path);
  store.db().transaction([&] {
    for (const NumericsCheck& c : checks) {
      store.db()
          .prepare("INSERT INTO numerics_checks (sweep_id, trial_id, status, reason, result) "
                   "VALUES (?, ?, ?, ?, ?)")
          .bind(1, sweep_id)
          .bind(2, c.trial_id)
          .bind(3, c.status)
          .bind(4, c.reason)
          .bind(5, c.to_json().dump())
          .run();
    }
  });
}

}  // namespace

CLI::App* add_recommend_command(CLI::App& app, RecommendOptions* options) {
  CLI::App* cmd = app.add_subcommand(
      "recommend", "Pick a sweep's best configuration and write it for ulysses-train, DeepSpeed, "
                   "ArcticTraining and Accelerate, with launch lines and WHY.md");
  cmd->add_option("--db", options->db_path, "Results database")->required();
  cmd->add_option("--sweep", options->sweep, "Sweep name (default: the newest)");
  cmd->add_option("--objective", options->objective, "throughput | max-seqlen (default: the "
                                                     "experiment's)")
      ->check(CLI::IsMember({"throughput", "max-seqlen"}));
  cmd->add_option("--out", options->out_dir,
                  "Output directory: new, empty, or an earlier recommendation (replaced); any "
                  "other directory is refused")
      ->required();
  cmd->add_option("--backend", options->backend,
                  "Rank only the trials of this backend, native (ulysses-train) or deepspeed "
                  "(default: every trial)")
      ->check(CLI::IsMember({"native", "deepspeed"}));
  cmd->add_option("--trainer", options->trainer,
                  "ulysses-train of the numerics check (default: beside ulysses-tune)");
  cmd->add_flag("--no-check", options->no_check,
                "Recommend without the numerics check (a short run of the winner against the "
                "same model on one rank); WHY.md says it was skipped");
  return cmd;
}

CLI::App* add_export_command(CLI::App& app, ExportOptions* options) {
  CLI::App* cmd = app.add_subcommand("export", "Write one trial's configuration in one format");
  cmd->add_option("--db", options->db_path, "Results database")->required();
  cmd->add_option("--trial", options->trial_id, "Trial id (ulysses-tune list)")->required();
  cmd->add_option("--format", options->format, "native | deepspeed | arctic | accelerate")
      ->check(CLI::IsMember({"native", "deepspeed", "arctic", "accelerate"}))
      ->capture_default_str();
  cmd->add_option("--out", options->out_path,
                  "Write to this file instead of stdout (an existing file only with --force)");
  cmd->add_flag("--force", options->force, "Replace the --out file if it exists");
  return cmd;
}

int run_recommend(const RecommendOptions& options) {
  store::Database db = report::open_results(options.db_path);  // read-only, never created
  StagedOutputDir staged(options.out_dir,
                         OutputOwner{"--out", "ulysses-tune recommend", {options.db_path}});
  store::SweepStore sweeps(db);
  const store::SweepRecord sweep = report::find_sweep(db, options.sweep);
  const experiment::Experiment e = experiment::parse_experiment(
      sweep.experiment_yaml, sweep.experiment_path, experiment::default_profiles_dir());
  Objective o = report::sweep_objective(sweep);  // the one every "best" follows
  if (!options.objective.empty()) o.kind = options.objective;
  // A configuration measured again alone (a sweep of several slots) is ranked by that.
  std::vector<store::TrialRecord> trials =
      store::alone_measurements_preferred(sweeps.trials(sweep.id));
  if (!options.backend.empty()) {
    std::erase_if(trials, [&](const store::TrialRecord& t) {
      return report::trial_backend(t) != options.backend;
    });
  }
  const std::vector<const store::TrialRecord*> ranked = rank_trials(trials, o);
  if (ranked.empty()) {
    throw UserError("--sweep " + sweep.name + ": no " +
                    (options.backend.empty() ? "" : options.backend + " ") +
                    "trial qualifies for " + o.kind +
                    (o.kind == "throughput" ? " at " + std::to_string(o.target_length) + " tokens"
                                            : std::string()) +
                    " within the memory head-room");
  }
  // The numerics check: the best candidate that agrees with the same model on one rank wins;
  // one that disagrees is not recommended, and the next configuration is checked.
  const fs::path& tmp = staged.staging();
  std::vector<NumericsCheck> checks;
  const store::TrialRecord* chosen = ranked.front();
  const std::string not_run = check_not_run_reason(sweep, *chosen);
  if (options.no_check || !not_run.empty()) {
    NumericsCheck c;
    c.trial_id = chosen->id;
    c.status = options.no_check ? "skipped" : "not_run";
    c.reason = options.no_check ? "--no-check" : not_run;
    if (!options.no_check) std::cerr << "note: numerics check not run: " << not_run << "\n";
    checks.push_back(c);
  } else {
    CheckOptions co;
    co.trainer = options.trainer.empty() ? sibling_binary("ulysses-train") : options.trainer;
    if (!fs::exists(co.trainer)) {
      throw UserError("--trainer: " + co.trainer + ": no such file (the numerics check runs "
                      "it; --no-check recommends without the check)");
    }
    co.work_dir = (tmp / "numerics-check").string();
    co.timeout_s = e.budget.trial_timeout_s;
    std::set<std::string> failed;  // configurations that failed: their other lengths too
    chosen = nullptr;
    for (const store::TrialRecord* t : ranked) {
      // Configurations that failed (at any length) and deepspeed trials (the check runs
      // ulysses-train) are passed over.
      if (failed.count(report::configuration(*t)) || report::trial_backend(*t) != "native") {
        continue;
      }
      if (static_cast<int>(checks.size()) == kMaxCheckedCandidates) break;
      std::cerr << "numerics check: trial #" << t->id << " (" << report::configuration(*t)
                << ") against the same model on one rank\n";
      checks.push_back(check_numerics(*t, co));
      const NumericsCheck& c = checks.back();
      // The configurations as a user re-runs them (outputs under runs/).
      const CheckConfigs shown = check_configs(
          *t, co, "runs/" + sweep.name + "-check-" + std::to_string(t->id) + "-candidate",
          "runs/" + sweep.name + "-check-" + std::to_string(t->id) + "-reference");
      const std::string stem = "trial-" + std::to_string(t->id);
      fs::create_directories(tmp / "numerics-check");
      write_file(tmp / "numerics-check" / (stem + "-candidate.yaml"), shown.candidate_yaml);
      write_file(tmp / "numerics-check" / (stem + "-reference.yaml"), shown.reference_yaml);
      if (c.status == "passed" || c.status == "not_run") {
        if (c.status == "not_run") {
          std::cerr << "note: numerics check not run: " << c.reason << "\n";
        }
        chosen = t;
        break;
      }
      std::cerr << "not recommended: trial #" << t->id << " (" << report::configuration(*t)
                << "): " << c.reason << "\n";
      failed.insert(report::configuration(*t));
    }
    store_checks(options.db_path, sweep.id, checks);
    if (chosen == nullptr) {
      std::cerr << "error: --sweep " << sweep.name << ": no candidate passed the numerics check ("
                << checks.size() << " checked; --no-check recommends without it)\n";
      return kExitFailure;
    }
  }
  const store::TrialRecord& winner = *chosen;
  const config::RunConfig tuned = tuned_config(winner, e, sweep.name);
  StepsByTrial steps;  // the measured steps of every fitting run: their spread decides ties
  for (const store::TrialRecord& t : trials) {
    if (t.status == "ok" && !t.probe) steps[t.id] = sweeps.trial_steps(t.id);
  }
  const std::vector<PointSummary> summaries = summarize_points(trials, o, winner, steps);
  std::vector<std::vector<store::TrialPhase>> phases;
  for (const PointSummary& s : summaries) {
    phases.push_back(s.best ? sweeps.trial_phases(s.best->id) : std::vector<store::TrialPhase>{});
  }

  // Everything goes into a directory beside --out, renamed into place at the end.
  write_file(tmp / "recommended.yaml",
             "# Recommended by ulysses-tune from sweep '" + sweep.name + "', trial #" +
                 std::to_string(winner.id) + " (objective " + o.kind + ", measured on backend " +
                 report::trial_backend(winner) + ").\n" +
                 config::to_yaml(tuned));
  exports::ExportFiles files = exports::write_exports(tuned, tmp.string(), e.nodes);
  files.warnings = exports::settle_torch_version_warning(std::move(files.warnings), tuned,
                                                         exports::local_torch_version());
  write_file(tmp / "launch.sh", launch_script(tuned, sweep, winner));
  write_file(tmp / "launch.sbatch",
             sbatch_script(tuned, sweep,
                           (fs::absolute(staged.target()) / "recommended.yaml").string()));
  fs::permissions(tmp / "launch.sh", fs::perms::owner_exec | fs::perms::group_exec |
                                         fs::perms::others_exec, fs::perm_options::add);
  std::string why = render_why(sweep, o, winner, summaries, phases);
  why += render_numerics_section(checks);
  if (!files.warnings.empty()) {
    why += "\n## Export warnings\n\n";
    for (const std::string& w : files.warnings) why += "- " + w + "\n";
  }
  write_file(tmp / "WHY.md", why);
  staged.commit();
  const fs::path& out = staged.target();

  for (const std::string& w : files.warnings) std::cerr << "warning: " << w << "\n";
  std::cout << "recommended: trial #" << winner.id << " (" << winner.seqlen << " tokens, dp "
            << winner.dp << " x sp " << winner.sp << ", "
            << static_cast<int64_t>(winner.tokens_per_s_per_rank.value_or(0))
            << " tokens/s per rank, measured on backend " << report::trial_backend(winner)
            << "; numerics check "
            << (checks.back().status == "not_run" ? "not run" : checks.back().status)
            << ")\nwrote " << out.string() << "/{recommended.yaml, "
            << (files.deepspeed_path.empty()
                    ? std::string()
                    : std::string("ds_config.json, ") + exports::kArcticRecipeFile +
                          ", accelerate_config.yaml, ")
            << "launch.sh, launch.sbatch, WHY.md"
            << (fs::exists(out / "numerics-check") ? ", numerics-check/" : "") << "}\n";
  return kExitOk;
}

int run_export(const ExportOptions& options) {
  const OutputOwner owner{"--out", "ulysses-tune export", {options.db_path}};
  if (!options.out_path.empty()) check_output_file(options.out_path, owner, options.force);
  store::Database db = report::open_results(options.db_path);
  store::SweepStore sweeps(db);
  const std::optional<store::TrialRecord> t = sweeps.trial(options.trial_id);
  if (!t) {
    throw UserError("--trial: no trial " + std::to_string(options.trial_id) + " in " +
                    options.db_path);
  }
  if (t->config_yaml.empty() || t->status == "invalid") {
    throw UserError("--trial: trial " + std::to_string(t->id) + " is " + t->status +
                    " and has no run config to export");
  }
  // The configuration exactly as the trial ran it, except its outputs: they go to
  // runs/<sweep>-trial-<id> (relative to where the job is started), never into the trial's run
  // directory, so running the export cannot write over what the trial measured.
  const std::optional<store::SweepRecord> sweep = sweeps.sweep(t->sweep_id);
  const std::string sweep_name = sweep ? sweep->name : "sweep";
  const config::RunConfig c = config::parse_run_config_yaml(
      t->config_yaml,
      {"output.dir=runs/" + sweep_name + "-trial-" + std::to_string(t->id)});
  if (report::trial_backend(*t) != "native") {
    std::cerr << "note: trial #" << t->id << " ran on the " << report::trial_backend(*t)
              << " backend (transformers + DeepSpeed)"
              << (options.format == "deepspeed" ? "; this is the DeepSpeed config it ran with"
                                                : "")
              << "\n";
  }
  std::string text;
  std::vector<std::string> warnings;
  if (options.format == "native") {
    text = config::to_yaml(c);
  } else if (options.format == "deepspeed") {
    exports::DeepSpeedExport x = exports::deepspeed_config(c);
    text = x.config.dump(2) + "\n";
    warnings = x.warnings;
  } else if (options.format == "arctic") {
    exports::ArcticRecipeExport x = exports::arctic_recipe(c);
    text = x.yaml, warnings = x.warnings;
  } else {
    exports::AccelerateExport x = exports::accelerate_config(c);
    text = x.yaml, warnings = x.warnings;
  }
  if (!warnings.empty()) {
    warnings = exports::settle_torch_version_warning(std::move(warnings), c,
                                                     exports::local_torch_version());
  }
  for (const std::string& w : warnings) std::cerr << "warning: " << w << "\n";
  if (options.out_path.empty()) {
    std::cout << text;
  } else {
    write_output_file(options.out_path, text, owner, options.force);
  }
  return kExitOk;
}

}  // namespace ulysses::recommend
