// `ulysses-tune sweep`: experiment -> space -> engine over real trials -> store (see
// sweep_command.h).
#include "tuner/sweep/sweep_command.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdlib>
#include <cstdio>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/output_dir.h"
#include "common/paths.h"
#include "tuner/backends/deepspeed/deepspeed_ops.h"
#include "tuner/backends/deepspeed/deepspeed_trial.h"
#include "tuner/calibrate/machine_check.h"
#include "tuner/experiment/experiment.h"
#include "tuner/experiment/result_inputs.h"
#include "tuner/experiment/training_data.h"
#include "tuner/experiment/trial_space.h"
#include "tuner/launch/launch_plan.h"
#include "tuner/launch/sbatch.h"
#include "tuner/launch/signal_block.h"
#include "tuner/search/engine.h"
#include "tuner/store/store.h"
#include "tuner/store/sweep_store.h"
#include "tuner/sweep/environment.h"
#include "tuner/sweep/sweep_host.h"
#include "tuner/trial/runner.h"
#include "tuner/trial/slots.h"

namespace ulysses::sweep {
namespace {

namespace fs = std::filesystem;

// About how many runs the search starts: the grid's, or for the smart search a bisection per
// point of a max-length search and one run per point and length otherwise (an upper bound).
int64_t expected_runs(const search::Space& space, const experiment::Experiment& e, int64_t points) {
  const int64_t n = static_cast<int64_t>(space.lengths.size());
  if (e.method == "grid" || !space.search_max) return points * n;
  int64_t steps = 1;
  while ((int64_t{1} << steps) < n) ++steps;
  return std::min(points * n, points * (1 + space.curve) + (e.probe ? 2 : 1) * steps * 2);
}

void dry_run(const experiment::Experiment& e, const search::Space& space) {
  std::printf("sweep %s: %lld ranks per trial, objective %s, search %s\n", e.name.c_str(),
              static_cast<long long>(e.world_size), e.objective.c_str(), e.method.c_str());
  std::printf("lengths (%s):", space.search_max ? "longest that fits" : "each");
  for (int64_t l : space.lengths) std::printf(" %lld", static_cast<long long>(l));
  std::printf("\n");
  int64_t valid = 0;
  for (const search::Point& p : search::all_points(space)) {
    // The search's own check (SweepHost::invalid_reason), so both call the same points invalid.
    const std::string why =
        invalid_point_reason(e, space, p, space.lengths.front()).value_or(std::string());
    if (why.empty()) ++valid;
    std::printf("  %-60s %s\n", search::describe(space, p).c_str(),
                why.empty() ? "valid" : ("invalid: " + why).c_str());
  }
  std::printf("%lld valid points; the exhaustive grid runs %lld trials\n",
              static_cast<long long>(valid),
              static_cast<long long>(valid * static_cast<int64_t>(space.lengths.size())));
}

// Whether some valid point of the space offloads activations or the optimizer to the host.
bool offloads(const experiment::Experiment& e, const search::Space& space) {
  for (const search::Point& p : search::all_points(space)) {
    try {
      const experiment::TrialPlan plan =
          experiment::plan_trial(e, space, p, space.lengths.front(), false, "unused");
      if (plan.config.memory.offload_activations || plan.config.memory.offload_optimizer) {
        return true;
      }
    } catch (const UserError&) {  // an invalid point runs nothing
    }
  }
  return false;
}

// `e` against the machine it runs on (calibrate/machine_check.h), before anything is written:
// the per-rank limit becomes the smaller of the profile's and the device's unless the experiment
// wrote one; a profile that overstates the device (or, where trials offload from a GPU, the
// host's memory or cores) is refused in one line.
void check_machine(experiment::Experiment& e, const calibrate::MachineCapacity& machine) {
  const calibrate::HardwareProfile hw = calibrate::load_hardware_profile(e.hardware_path);
  e.memory_limit_gib = calibrate::checked_memory_limit_gib(hw, e.hardware_path, machine,
                                                           e.memory_limit_gib,
                                                           e.memory_limit_given);
  if (e.device == "cuda") {
    calibrate::check_offload_host(hw, e.hardware_path, machine,
                                  offloads(e, experiment::build_space(e)));
  }
}

// Where trial run directories go: --runs-dir, or <db dir>/runs/<sweep name>.
std::string runs_dir_of(const SweepOptions& options, const std::string& name) {
  return !options.runs_dir.empty()
             ? options.runs_dir
             : (fs::absolute(options.db_path).parent_path() / "runs" / name).string();
}

// Trial directories go only into a directory this sweep created (or an empty one): two sweeps of
// one name in two databases beside each other would otherwise write the same trial directories.
// `claim` false: only the checks (nothing is created).
void claim_runs_dir(const SweepOptions& options, const std::string& name, bool claim = true) {
  const OutputOwner owner{"--runs-dir", "ulysses-tune sweep", {options.db_path}};
  const std::string identity = "sweep '" + name + "' of " + fs::absolute(options.db_path).string();
  if (claim) {
    claim_output_dir(runs_dir_of(options, name), owner, identity);
  } else {
    check_claimable_output(runs_dir_of(options, name), owner, identity);
  }
}

// `text` with its line breaks replaced by spaces, to embed in a comment line of a script.
std::string one_line(std::string text) {
  for (char& ch : text) {
    if (ch == '\n' || ch == '\r') ch = ' ';
  }
  return text;
}

// --resume continues only the experiment the sweep started with: its stored results would
// otherwise be replayed as facts about another configuration (experiment/result_inputs.h).
// Throws UserError "--resume: <key> ..." naming the first input that differs.
void check_unchanged(const store::SweepRecord& sweep, const experiment::Experiment& e,
                     const SweepOptions& options, const calibrate::MachineCapacity& machine) {
  const std::string advice =
      "; resume with the experiment it started with (only budget.max_trials and "
      "budget.wall_clock_s may change), or start a new sweep with --name";
  std::vector<experiment::ResultInput> before;
  try {
    // Profiles given as relative paths resolve beside the experiment file given now.
    experiment::Experiment stored = experiment::parse_experiment(
        sweep.experiment_yaml, options.experiment_path, experiment::default_profiles_dir());
    stored.method = sweep.search;  // as it ran (--search may have overridden the file)
    check_machine(stored, machine);  // its limit as this machine makes it, like `e`'s
    before = experiment::result_inputs(stored);
  } catch (const UserError& err) {
    throw UserError("--resume: the experiment sweep '" + sweep.name +
                    "' started with no longer reads (" + err.what() + ")" + advice);
  }
  const std::vector<experiment::ResultInput> now = experiment::result_inputs(e);
  if (const std::string key = experiment::first_difference(before, now); !key.empty()) {
    auto value_of = [&](const std::vector<experiment::ResultInput>& inputs) {
      for (const experiment::ResultInput& input : inputs) {
        if (input.key == key) return input.value;
      }
      return std::string("(none)");
    };
    const std::string was = value_of(before), is = value_of(now);
    const bool short_values = was.size() + is.size() < 120 &&
                              (was + is).find_first_of("\r\n") == std::string::npos;
    throw UserError("--resume: " + key + " changed" +
                    (short_values ? " (" + was + " -> " + is + ")" : "") +
                    " since sweep '" + sweep.name + "' started" + advice);
  }
  const nlohmann::json env = nlohmann::json::parse(sweep.environment, nullptr, false);
  if (!env.is_object() || !env.contains("experiment_digests")) return;  // an older sweep
  const nlohmann::json& stored = env["experiment_digests"];
  for (const auto& [what, digest] : experiment::profile_digests(e)) {
    if (!stored.is_object() || !stored.contains(what) || stored[what] == digest) continue;
    const std::string changed =
        what == "hardware_profile" ? "hardware: the profile " + e.hardware_path + " changed"
        : what == "data"           ? "base.data.source: the data its trials read changed"
                                   : "base.model: the model (its preset or HF config) changed";
    throw UserError("--resume: " + changed + " since sweep '" + sweep.name + "' started" + advice);
  }
}

// The sweep's environment with the digests of what its experiment's text does not hold.
std::string environment_of(const std::string& trainer, const experiment::Experiment& e) {
  nlohmann::ordered_json env = nlohmann::ordered_json::parse(capture_environment(trainer));
  env["experiment_digests"] = experiment::profile_digests(e);
  env["data"] = experiment::training_data_json(e.data);
  return env.dump();
}

// "a, b" for the sweeps in a database, or "none".
std::string sweep_names(store::SweepStore& sweeps) {
  std::string names;
  for (const store::SweepRecord& s : sweeps.sweeps()) names += (names.empty() ? "" : ", ") + s.name;
  return names.empty() ? "none" : names;
}

// The Python of the deepspeed backend's ranks ("" when the experiment has no deepspeed trials),
// checked to import what ds_trial.py needs before anything is written.
std::string deepspeed_python(const SweepOptions& options, const experiment::Experiment& e) {
  if (std::find(e.backends.begin(), e.backends.end(), "deepspeed") == e.backends.end()) return "";
  const char* env = std::getenv("ULYSSES_PYTHON");
  std::string python = !options.python.empty() ? options.python : (env && *env ? env : "python3");
  if (python.find('/') == std::string::npos) {  // ranks are started by execve: no PATH lookup
    const std::string found = find_on_path(python);
    if (found.empty()) throw UserError("--python: " + python + " is not on PATH");
    python = found;
  }
  const std::string versions = command_output(
      shell_quote(python) + " -c 'import deepspeed, transformers, torch; print(deepspeed.__version__)'");
  if (versions.empty()) {
    throw UserError("--python: " + python + " cannot import deepspeed, transformers and torch "
                    "(the deepspeed backend's ranks need them; pass --python or set "
                    "ULYSSES_PYTHON)");
  }
  if (!fs::is_regular_file(backends::deepspeed_trial_script())) {
    throw UserError("backend: deepspeed: " + backends::deepspeed_trial_script() +
                    ": no such file (set ULYSSES_HOME to the project's directory)");
  }
  // DeepSpeed's ops, built once here (no trial timeout) so that trials only load them.
  if (!options.submit) backends::prepare_deepspeed_ops(python, e.device);
  return python;
}

// At the end of a sweep of several slots, the most configurations re-measured alone.
constexpr int kMaxRemeasures = 3;

// The sweep's slots (trial/slots.h): the experiment's count (0 = auto) split over what this
// process has: its cores, this node's GPUs, or the allocation's nodes.
std::vector<trial::Slot> sweep_slots(const experiment::Experiment& e) {
  trial::SlotNeeds needs;
  needs.runner = e.runner;
  needs.device = e.device;
  needs.world_size = e.world_size;
  needs.nodes = e.nodes;
  if (e.slots == 1) return {trial::Slot{}};
  trial::SlotResources have;
  have.cores = trial::affinity_cores();
  if (e.runner == "srun") {
    have.nodes = trial::allocation_nodes();
  } else if (e.device == "cuda") {
    have.cuda_devices = trial::local_cuda_devices();
  }
  return trial::split_slots(trial::resolve_slot_count(e.slots, needs, have), needs, have);
}

// --submit: this sweep as one sbatch job of the experiment's size (see sweep_command.h).
int submit_sweep(const SweepOptions& options, const experiment::Experiment& e,
                 const std::string& name, const std::string& trainer, bool resume) {
  if (e.runner != "srun") {
    throw UserError("--submit: needs runner: srun (the experiment's runner is " + e.runner +
                    "; add `runner: srun` to it or pass --runner srun)");
  }
  const std::string runs_dir = fs::absolute(runs_dir_of(options, name)).string();
  if (runs_dir.find_first_of("\r\n") != std::string::npos) {  // it goes into #SBATCH --output
    throw UserError(std::string(options.runs_dir.empty() ? "--db" : "--runs-dir") +
                    ": a path with a line break cannot go into an sbatch script");
  }
  const std::string db = fs::absolute(options.db_path).string();
  std::vector<std::string> words{sibling_binary("ulysses-tune"), "sweep",
                                 fs::absolute(options.experiment_path).string(),
                                 "--db", db, "--name", name, "--runs-dir", runs_dir,
                                 "--runner", "srun", "--trainer", fs::absolute(trainer).string(),
                                 "--search", e.method};
  if (options.max_trials >= 0) words.insert(words.end(), {"--max-trials", std::to_string(options.max_trials)});
  if (options.wall_clock_s >= 0) {
    words.insert(words.end(), {"--wall-clock-s", std::to_string(options.wall_clock_s)});
  }
  if (!options.slots.empty()) words.insert(words.end(), {"--slots", options.slots});
  if (resume) words.push_back("--resume");
  if (!options.python.empty()) words.insert(words.end(), {"--python", options.python});
  std::string command = "exec";
  for (const std::string& word : words) command += " " + shell_quote(word);

  launch::SbatchJob job;
  job.job_name = "ulysses-sweep-" + name;
  // Slots of an allocation are node sets: the job holds `nodes` for each; auto, as many as the
  // hardware profile's nodes hold (inside the job, auto then finds that many). With several, a
  // node that fails leaves the job (--no-kill) and the sweep retires its slot, instead of SLURM
  // cancelling the whole sweep.
  const int64_t slots =
      e.slots > 0 ? e.slots
                  : std::max<int64_t>(1, calibrate::load_hardware_profile(e.hardware_path).nodes /
                                             e.nodes);
  job.nodes = static_cast<int>(e.nodes * slots);
  job.no_kill = slots > 1;
  job.ntasks_per_node = static_cast<int>(e.world_size / e.nodes);
  if (e.device == "cuda") job.gpus_per_node = job.ntasks_per_node;  // one GPU per rank
  if (e.budget.wall_clock_s > 0) {  // the budget, one more trial and a margin
    job.time_limit_min = static_cast<int>(
        std::ceil((e.budget.wall_clock_s + e.budget.trial_timeout_s) / 60.0)) + 5;
  }
  job.output = runs_dir + "/sweep-%j.log";
  job.comments = {"Written by `ulysses-tune sweep --submit`: sweep '" + name + "' of " +
                      one_line(e.path) + " inside one allocation;",
                  "each trial is one srun job step. scancel the job to stop it; resubmit with "
                  "--resume (or run the exec line with --resume inside salloc) to continue."};
  job.body = {"cd " + shell_quote(fs::current_path().string()), command};
  const std::string script = runs_dir + "/sweep.sbatch";
  {
    std::ofstream out(script, std::ios::trunc);
    out << launch::sbatch_script(job);
    if (!out.flush()) throw UserError("--submit: cannot write " + script);
  }
  const std::string job_id = launch::submit_sbatch(script);
  std::printf("submitted job %s: sweep %s (%lld nodes x %lld ranks per node%s)\n",
              job_id.c_str(), name.c_str(), static_cast<long long>(job.nodes),
              static_cast<long long>(job.ntasks_per_node), resume ? ", resumed" : "");
  std::printf("database: %s\nlog: %s/sweep-%s.log\nscript: %s\n", db.c_str(), runs_dir.c_str(),
              job_id.c_str(), script.c_str());
  return kExitOk;
}

}  // namespace

CLI::App* add_sweep_command(CLI::App& app, SweepOptions* options) {
  CLI::App* cmd = app.add_subcommand(
      "sweep", "Explore an experiment's space with real ulysses-train trials; store every trial");
  cmd->add_option("experiment", options->experiment_path, "Experiment file (experiments/*.yaml)")
      ->required();
  cmd->add_option("--db", options->db_path, "Results database (SQLite)")->capture_default_str();
  cmd->add_option("--name", options->name,
                  "Sweep name in the database: letters, digits, '.', '_', '-' (default: the "
                  "experiment's name, + \"-grid\" for --search grid)");
  cmd->add_option("--search", options->method, "smart (default) or grid (every point x length)")
      ->check(CLI::IsMember({"smart", "grid"}));
  cmd->add_option("--runs-dir", options->runs_dir,
                  "Where trial run directories go (default: <db dir>/runs/<sweep name>)");
  cmd->add_option("--trainer", options->trainer, "ulysses-train to run (default: beside ulysses-tune)");
  cmd->add_option("--max-trials", options->max_trials,
                  "Override the experiment's budget.max_trials (0 = no limit)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--wall-clock-s", options->wall_clock_s,
                  "Override the experiment's budget.wall_clock_s (0 = no limit)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--resume", options->resume,
                "Continue the sweep of this name: finished trials are kept, `running` ones re-run");
  cmd->add_flag("--dry-run", options->dry_run, "Print the space and validity; run and write nothing");
  cmd->add_option("--runner", options->runner,
                  "local (ranks as local processes) or srun (each trial one SLURM job step; "
                  "inside salloc / sbatch); default: the experiment's")
      ->check(CLI::IsMember({"local", "srun"}));
  cmd->add_option("--slots", options->slots,
                  "Trials run side by side, each on its own cores, devices or nodes (a number, "
                  "or auto); default: the experiment's slots (1)");
  cmd->add_option("--python", options->python,
                  "Python with torch, transformers and deepspeed for trials of the deepspeed "
                  "backend (default: $ULYSSES_PYTHON, else python3)");
  cmd->add_flag("--submit", options->submit,
                "Submit this sweep as one sbatch job of the experiment's size (runner srun) and "
                "print its job id; with --resume the job continues the sweep");
  return cmd;
}

int run_sweep(const SweepOptions& options) {
  if (!options.name.empty()) experiment::check_sweep_name("--name", options.name);
  experiment::Experiment e =
      experiment::load_experiment(options.experiment_path, experiment::default_profiles_dir());
  if (!options.method.empty()) e.method = options.method;
  if (options.max_trials >= 0) e.budget.max_trials = options.max_trials;
  if (options.wall_clock_s >= 0) e.budget.wall_clock_s = options.wall_clock_s;
  if (!options.runner.empty()) e.runner = options.runner;
  if (!options.slots.empty()) e.slots = experiment::parse_slots("--slots", options.slots);
  if (e.runner == "local" && e.nodes > 1) {
    throw UserError("--runner: local cannot run trials of " + std::to_string(e.nodes) + " nodes");
  }
  const calibrate::MachineCapacity machine = calibrate::query_machine(e.device);
  check_machine(e, machine);
  const search::Space space = experiment::build_space(e);
  if (options.dry_run) {
    dry_run(e, space);
    return kExitOk;
  }
  const std::string name =
      !options.name.empty() ? options.name : e.name + (e.method == "grid" ? "-grid" : "");
  const std::string trainer = options.trainer.empty() ? sibling_binary("ulysses-train")
                                                      : options.trainer;
  if (!fs::exists(trainer)) throw UserError("--trainer: " + trainer + ": no such file");
  const std::string python = deepspeed_python(options, e);

  // Created before anything is written: runner srun checks for an allocation here.
  std::unique_ptr<trial::TrialRunner> runner;
  if (!options.submit) runner = trial::make_trial_runner(e.runner);
  if (options.submit && find_on_path("sbatch").empty()) {
    throw UserError("--submit: sbatch is not on PATH (run on a SLURM login node)");
  }
  // A slot that cannot hold a trial is refused before anything is written.
  const std::vector<trial::Slot> slots =
      options.submit ? std::vector<trial::Slot>{trial::Slot{}} : sweep_slots(e);
  claim_runs_dir(options, name, /*claim=*/false);  // before the database is created

  store::Store db = store::Store::open(options.db_path);
  store::SweepStore sweeps(db.db());
  std::optional<store::SweepRecord> existing = sweeps.find_sweep(name);
  if (existing && !options.resume) {
    throw UserError(options.db_path + ": sweep '" + name +
                    "' exists (use --resume to continue it, or --name for a new one)");
  }
  if (!existing && options.resume) {
    throw UserError(options.db_path + ": no sweep '" + name + "' to resume (its sweeps: " +
                    sweep_names(sweeps) + "; pass --name, or --search grid for a grid sweep)");
  }
  if (existing) check_unchanged(*existing, e, options, machine);
  claim_runs_dir(options, name);
  if (options.submit) return submit_sweep(options, e, name, trainer, options.resume);
  store::SweepRecord sweep;
  if (existing) {
    sweep = *existing;
  } else {
    sweep.name = name;
    sweep.experiment_path = options.experiment_path;  // as given: reports show no machine paths
    sweep.experiment_yaml = e.yaml;
    sweep.search = e.method;
    sweep.objective = e.objective;
    sweep.id = sweeps.create_sweep(sweep);
  }
  sweep.status = "running";
  sweep.environment = environment_of(trainer, e);
  sweeps.update_sweep(sweep);

  HostSettings settings;
  settings.slots = slots;
  settings.isolation = e.isolation;
  settings.runs_dir = runs_dir_of(options, name);
  settings.trainer = trainer;
  settings.python = python;
  settings.runner = runner.get();
  const int64_t points = static_cast<int64_t>(search::all_points(space).size());
  settings.expected_runs = expected_runs(space, e, points);
  std::printf(
      "sweep %s: %lld points x %zu lengths, %lld ranks per trial, objective %s, search %s, "
      "runner %s%s%s\n",
      name.c_str(), static_cast<long long>(points), space.lengths.size(),
      static_cast<long long>(e.world_size), e.objective.c_str(), e.method.c_str(),
      e.runner == "srun" ? ("srun (" + std::to_string(e.nodes) + " nodes per trial)").c_str()
                         : "local",
      slots.size() > 1 ? (", " + std::to_string(slots.size()) + " slots (" +
                          slots.front().label + ", ...), isolation " + e.isolation)
                             .c_str()
                       : "",
      existing ? " (resumed)" : "");
  std::fflush(stdout);

  SweepHost host(e, space, sweeps, sweep.id, settings);
  search::Options engine_options;
  engine_options.method = e.method;
  engine_options.probe = e.probe;
  engine_options.prune = e.prune;
  engine_options.workers = static_cast<int>(slots.size());
  // Several slots: trials are supervised on one thread per slot, so SIGINT, SIGTERM and SIGCHLD
  // are blocked in every thread and taken by the supervisions or by SweepHost::idle.
  launch::SignalBlock blocked(slots.size() > 1);
  search::Summary summary;
  int status = kExitOk;
  // The engine's summary goes with an exception: then what the host counted up to it.
  auto counted_so_far = [&] {
    search::Summary counted = host.counted();
    counted.grid_runs = (points - counted.invalid) * static_cast<int64_t>(space.lengths.size());
    return counted;
  };
  auto store_summary = [&] {
    nlohmann::ordered_json s;
    s["trials_run"] = summary.runs + summary.probes;  // every ulysses-train run, probes included
    s["probes"] = summary.probes;
    s["replayed"] = host.replayed();
    s["pruned"] = summary.pruned;
    s["skipped"] = summary.skipped;
    s["invalid_points"] = summary.invalid;
    s["invalid_at_length"] = summary.invalid_at_length;
    s["grid_trials"] = summary.grid_runs;
    s["budget_exhausted"] = summary.budget_exhausted;
    s["best_trial"] = host.best_trial();
    sweep.summary = s.dump();
    if (sweep.status == "finished") sweep.finished_at = utc_now();
    sweeps.update_sweep(sweep);
  };
  try {
    summary = search::run_search(space, engine_options, host);
    host.settle_unvisited();
    if (const int64_t again = host.remeasure_best(kMaxRemeasures); again > 0) {
      summary.runs += again;
    }
    sweep.status = "finished";
  } catch (const Interrupted& stop) {
    sweep.status = "interrupted";
    status = kExitInterrupted;
    summary = counted_so_far();
  } catch (const UserError&) {  // the sweep cannot go on: it ends `failed`, the error printed
    sweep.status = "failed";
    summary = counted_so_far();
    store_summary();
    blocked.release();  // a stop asked for now would end the process before the error is printed
    throw;
  }
  store_summary();
  // A SIGINT or SIGTERM that came once the sweep had nothing left to stop (after its last trial,
  // while it stored the summary) is taken here: its default action would end the process with
  // the sweep finished but its result unprinted.
  if (const int late = blocked.release(); late != 0 && sweep.status == "finished") {
    std::fprintf(stderr, "sweep %s: %s came after the last trial had ended; nothing was stopped\n",
                 name.c_str(), late == SIGINT ? "SIGINT" : "SIGTERM");
  }

  std::printf(
      "sweep %s %s: %lld trials run (%lld of them probes), %lld pruned, %lld skipped, %lld invalid "
      "points%s; the exhaustive grid would run %lld%s\n",
      name.c_str(), sweep.status.c_str(), static_cast<long long>(summary.runs + summary.probes),
      static_cast<long long>(summary.probes), static_cast<long long>(summary.pruned),
      static_cast<long long>(summary.skipped), static_cast<long long>(summary.invalid),
      summary.invalid_at_length > 0
          ? (", " + std::to_string(summary.invalid_at_length) + " trials invalid at their length")
                .c_str()
          : "",
      static_cast<long long>(summary.grid_runs),
      summary.budget_exhausted ? " (budget exhausted)" : "");
  if (host.best_trial() > 0) {
    std::printf("best: trial #%lld (ulysses-tune show --db %s --trial %lld)\n",
                static_cast<long long>(host.best_trial()), options.db_path.c_str(),
                static_cast<long long>(host.best_trial()));
  }
  return status;
}

}  // namespace ulysses::sweep
