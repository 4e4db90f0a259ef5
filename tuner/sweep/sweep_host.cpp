// Running, replaying, pruning and recording trials for the engine (see sweep_host.h).
#include "tuner/sweep/sweep_host.h"

#include <c10/util/Exception.h>
#include <signal.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "config/run_config.h"
#include "tuner/backends/deepspeed/deepspeed_trial.h"
#include "tuner/calibrate/machine_check.h"
#include "tuner/costmodel/memory_model.h"
#include "tuner/experiment/trial_space.h"
#include "tuner/results/calibrated_model.h"
#include "tuner/results/format.h"
#include "tuner/results/memory_basis.h"
#include "tuner/results/objective.h"
#include "tuner/sweep/environment.h"
#include "tuner/trial/trial_runner.h"

namespace ulysses::sweep {
namespace {

namespace fs = std::filesystem;
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

}  // namespace

std::string utc_now() {
  char buffer[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(buffer, sizeof buffer, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return buffer;
}

namespace {

bool finished(const std::string& status) {
  return status == "ok" || status == "oom" || status == "failed" || status == "timeout" ||
         status == "killed";
}

}  // namespace

std::string trial_key(const search::Space& space, const search::Point& p, int64_t length,
                      bool probe) {
  return search::describe(space, p) + " L=" + std::to_string(length) + (probe ? " probe" : "");
}

SweepHost::SweepHost(const experiment::Experiment& e, const search::Space& space,
                     store::SweepStore& store, int64_t sweep_id, const HostSettings& settings)
    : e_(e), space_(space), store_(store), sweep_id_(sweep_id), settings_(settings),
      progress_(settings.expected_runs) {
  on_cuda_ = e.device == "cuda";
  model_ = plan::load_model(store_.db(), e.device);
  hardware_ = calibrate::load_hardware_profile(e.hardware_path);
  for (store::TrialRecord& r : store_.trials(sweep_id)) previous_[r.key] = std::move(r);
  TORCH_CHECK(!settings_.slots.empty(), "SweepHost: no slot");
  slot_busy_.assign(settings_.slots.size(), 0);
  slot_retired_.assign(settings_.slots.size(), 0);
}

int64_t SweepHost::trial_limit_bytes() const {
  return static_cast<int64_t>(experiment::trial_memory_limit_gib(e_) * kGiB);
}

store::TrialRecord SweepHost::base_record(const search::Point& p, int64_t length, bool probe) {
  store::TrialRecord r;
  r.sweep_id = sweep_id_;
  r.key = trial_key(space_, p, length, probe);
  r.point = search::point_json(space_, p);
  r.seqlen = length;
  r.probe = probe;
  r.world_size = e_.world_size;
  r.dp = r.sp = 0;  // unknown until planned
  if (e_.memory_limit_gib > 0) r.limit_bytes = trial_limit_bytes();
  return r;
}

std::optional<std::string> invalid_point_reason(const experiment::Experiment& e,
                                                const search::Space& space, const search::Point& p,
                                                int64_t length) {
  try {
    const experiment::TrialPlan plan = experiment::plan_trial(e, space, p, length, false, "unused");
    if (experiment::point_backend(space, p) == backends::kDeepSpeedBackend) {
      return backends::deepspeed_refusal(plan.config);
    }
    return std::nullopt;
  } catch (const UserError& err) {
    return std::string(err.what());
  }
}

std::optional<std::string> SweepHost::invalid_reason(const search::Point& p) {
  const std::lock_guard<std::mutex> lock(mutex_);
  return invalid_point_reason(e_, space_, p, space_.lengths.front());
}

std::optional<std::string> SweepHost::prune_reason(const search::Point& p, int64_t length) {
  const std::lock_guard<std::mutex> lock(mutex_);
  if (e_.memory_limit_gib <= 0) return std::nullopt;
  // The memory model's lower bound is ulysses-train's, not a bound for another stack.
  if (experiment::point_backend(space_, p) != backends::kNativeBackend) return std::nullopt;
  // A rule this length breaks is not a memory verdict: run() stores the trial `invalid`.
  const std::optional<experiment::TrialPlan> plan = try_plan(p, length);
  if (!plan) return std::nullopt;
  const int64_t predicted = costmodel::lower_bound_peak(plan->config).total_bytes();
  if (predicted <= trial_limit_bytes()) return std::nullopt;
  return "memory model: at least " + report::memory_size(predicted) + " per rank > limit " +
         report::memory_size(trial_limit_bytes());
}

std::optional<experiment::TrialPlan> SweepHost::try_plan(const search::Point& p, int64_t length) {
  try {
    return experiment::plan_trial(e_, space_, p, length, false, "unused");
  } catch (const UserError&) {
    return std::nullopt;
  }
}

void SweepHost::fill_plan(const experiment::TrialPlan& plan, store::TrialRecord* r) {
  r->config_yaml = plan.yaml;
  r->dp = plan.config.mesh.dp;
  r->sp = plan.config.mesh.sp;
}

search::RunOutcome SweepHost::outcome_of(const store::TrialRecord& r) {
  search::RunOutcome o;
  o.trial_id = r.id;
  if (r.status == "oom") {
    o.result = search::Result::kOom;
  } else if (r.status != "ok") {
    o.result = search::Result::kFailed;
  } else if (on_cuda_ && r.limit_bytes && r.peak_mem_bytes &&
             *r.peak_mem_bytes > (1.0 - e_.headroom) * static_cast<double>(*r.limit_bytes)) {
    o.result = search::Result::kOom;  // fits, but without the head-room the recommendation keeps
  } else {
    o.result = search::Result::kFits;
    o.value = r.tokens_per_s_per_rank.value_or(0.0);
  }
  return o;
}

void SweepHost::note_best(const store::TrialRecord& r, const search::RunOutcome& o) {
  if (r.remeasure_of && *r.remeasure_of == best_id_) {  // the best measured alone stands for it
    best_id_ = 0, best_length_ = 0, best_value_ = 0.0;
  }
  if (o.result != search::Result::kFits || r.probe) return;
  const bool better = e_.objective == "max-seqlen"
                          ? (r.seqlen > best_length_ ||
                             (r.seqlen == best_length_ && o.value > best_value_))
                          : (r.seqlen == e_.target_length && o.value > best_value_);
  if (!better) return;
  best_id_ = r.id, best_length_ = r.seqlen, best_value_ = o.value;
  char text[256];
  std::snprintf(text, sizeof text, "#%lld L=%lld %.0f tok/s/rank", static_cast<long long>(r.id),
                static_cast<long long>(r.seqlen), o.value);
  progress_.set_best(text);
}

search::RunOutcome SweepHost::run(const search::Point& p, int64_t length, bool probe) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (reserved_ > 0) --reserved_;  // budget_left() allowed this run
  if (stop_signal_ != 0) throw Interrupted(stop_signal_);
  return run_point(lock, p, length, probe, trial_key(space_, p, length, probe), std::nullopt);
}

search::RunOutcome SweepHost::run_point(std::unique_lock<std::mutex>& lock, const search::Point& p,
                                        int64_t length, bool probe, const std::string& key,
                                        std::optional<int64_t> remeasure_of) {
  if (auto it = previous_.find(key); it != previous_.end() && finished(it->second.status)) {
    ++replayed_;
    const search::RunOutcome o = outcome_of(it->second);
    note_best(it->second, o);
    progress_.finished(key, it->second.status, "(stored, not re-run)", /*replayed=*/true);
    ++(probe ? counted_.probes : counted_.runs);
    return o;
  }
  store::TrialRecord r = base_record(p, length, probe);
  r.key = key;
  r.remeasure_of = remeasure_of;
  written_.insert(key);
  // A rule that only this length breaks (the point itself passed invalid_reason): not run.
  if (std::optional<std::string> why = invalid_point_reason(e_, space_, p, length)) {
    r.status = "invalid";
    r.reason = *why;
    if (std::optional<experiment::TrialPlan> plan = try_plan(p, length)) fill_plan(*plan, &r);
    store_.add_trial(r);
    progress_.not_run(key, r.status, r.reason);
    ++counted_.invalid_at_length;
    search::RunOutcome not_run;  // kFailed: says nothing about memory
    not_run.ran = false;
    return not_run;
  }
  store_.begin_trial(r);  // `running` until its result is stored
  ++started_;
  const std::string run_dir = (fs::path(settings_.runs_dir) / std::to_string(r.id)).string();
  const experiment::TrialPlan plan =
      experiment::plan_trial(e_, space_, p, length, probe, run_dir + "/out");
  fill_plan(plan, &r);
  r.run_dir = run_dir;
  const bool native = experiment::point_backend(space_, p) == backends::kNativeBackend;
  if (native) predict(plan.config, &r);

  trial::TrialSpec spec;
  spec.run_dir = run_dir;
  spec.config_yaml = plan.yaml;
  spec.output_dir = run_dir + "/out";
  spec.nproc = static_cast<int>(e_.world_size);
  spec.timeout_s = e_.budget.trial_timeout_s;
  spec.trainer = settings_.trainer;
  spec.nnodes = static_cast<int>(e_.nodes);
  spec.name = "ulysses-trial-" + std::to_string(r.id);
  store::TrialLoad load;  // how loaded the machine was while the trial ran
  load.trial_id = r.id;
  load.cores = calibrate::online_cores();
  try {
    if (!native) {
      const backends::DeepSpeedTrial ds =
          backends::prepare_deepspeed_trial(plan.config, run_dir, settings_.python);
      spec.trainer = ds.program;
      spec.trainer_args = ds.arguments;
      spec.config_yaml = ds.config_yaml;
    }
  } catch (const UserError& err) {  // its files could not be written: the trial failed
    return not_started(r, key, err.what());
  }
  return run_on_slot(lock, r, key, spec, remeasure_of.has_value() || must_run_alone(plan.config),
                     load);
}

int64_t SweepHost::remeasure_best(int max_runs) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (settings_.slots.size() <= 1) return 0;
  report::Objective o;  // as recommend ranks (results/objective.h)
  o.kind = e_.objective;
  o.target_length = e_.target_length;
  o.headroom = e_.headroom;
  o.check_peak = on_cuda_;
  int64_t runs = 0;
  for (int attempt = 0; attempt < max_runs; ++attempt) {
    const std::vector<store::TrialRecord> trials =
        store::alone_measurements_preferred(store_.trials(sweep_id_));
    const std::vector<const store::TrialRecord*> ranked = report::rank_trials(trials, o);
    if (ranked.empty()) break;
    const store::TrialRecord& best = *ranked.front();
    if (best.remeasure_of) break;  // its configuration was measured alone
    bool had_neighbours = false;
    for (const store::TrialNeighbour& n : store_.trial_neighbours(sweep_id_)) {
      had_neighbours = had_neighbours || n.trial_id == best.id;
    }
    if (!had_neighbours) break;
    if (e_.budget.max_trials > 0 && started_ + replayed_ >= e_.budget.max_trials) break;
    if (e_.budget.wall_clock_s > 0 && progress_.elapsed_s() >= e_.budget.wall_clock_s) break;
    std::optional<search::Point> point;
    for (const search::Point& p : search::all_points(space_)) {
      if (trial_key(space_, p, best.seqlen, false) == best.key) point = p;
    }
    TORCH_CHECK(point.has_value(), "remeasure_best: no point of the space has key ", best.key);
    const search::RunOutcome out =
        run_point(lock, *point, best.seqlen, false, best.key + " remeasure", best.id);
    ++runs;
    if (!out.ran) break;
  }
  return runs;
}

bool SweepHost::must_run_alone(const config::RunConfig& c) const {
  if (settings_.slots.size() <= 1 || settings_.runner->kind() == "srun") return false;
  if (settings_.isolation == "all_alone") return true;
  if (settings_.isolation == "shared") return false;
  return c.memory.offload_optimizer || c.memory.offload_activations;
}

size_t SweepHost::acquire_slot(std::unique_lock<std::mutex>& lock, bool alone) {
  if (alone) ++alone_waiting_;
  size_t chosen = settings_.slots.size();
  slot_freed_.wait(lock, [&] {
    if (stop_signal_ != 0) return true;
    bool any_live = false;
    for (size_t i = 0; i < settings_.slots.size(); ++i) any_live = any_live || !slot_retired_[i];
    if (!any_live) return true;
    if (alone_running_ || (alone ? busy_ > 0 : alone_waiting_ > 0)) return false;
    for (size_t i = 0; i < settings_.slots.size(); ++i) {
      if (!slot_busy_[i] && !slot_retired_[i]) {
        chosen = i;
        return true;
      }
    }
    return false;
  });
  if (alone) --alone_waiting_;
  slot_freed_.notify_all();  // a trial waiting behind this one may go now
  if (stop_signal_ != 0) throw Interrupted(stop_signal_);
  if (chosen == settings_.slots.size()) {
    throw UserError("slots: every slot was taken out of use after a node failure; the sweep "
                    "cannot go on (see the lines above)");
  }
  slot_busy_[chosen] = 1;
  ++busy_;
  if (alone) alone_running_ = true;
  return chosen;
}

void SweepHost::stop_all(int signal) {
  if (stop_signal_ == 0) stop_signal_ = signal;
  for (const auto& [id, thread] : running_threads_) {
    if (!pthread_equal(thread, pthread_self())) pthread_kill(thread, signal);
  }
  slot_freed_.notify_all();
}

void SweepHost::idle() {
  if (settings_.slots.size() <= 1) return;
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  const timespec now{0, 0};
  const int signal = sigtimedwait(&signals, nullptr, &now);
  if (signal != SIGINT && signal != SIGTERM) return;
  const std::lock_guard<std::mutex> lock(mutex_);
  stop_all(signal);
  throw Interrupted(signal);
}

search::RunOutcome SweepHost::run_on_slot(std::unique_lock<std::mutex>& lock,
                                          store::TrialRecord& r, const std::string& key,
                                          trial::TrialSpec spec, bool alone,
                                          store::TrialLoad load) {
  const std::vector<std::string> base_env = spec.extra_env;
  trial::TrialOutcome outcome;
  std::string failures;  // node failures this trial ran into, for its reason
  for (;;) {
    const size_t index = acquire_slot(lock, alone);
    const trial::Slot& slot = settings_.slots[index];
    r.slot = slot.label;
    spec.extra_env = base_env;
    spec.cpus.clear();
    spec.nodelist.clear();
    if (settings_.runner->kind() == "srun") {
      spec.nodelist = slot.nodes;
    } else {
      spec.cpus = slot.cores;
      if (!slot.cuda_devices.empty()) {
        spec.extra_env.push_back("CUDA_VISIBLE_DEVICES=" + slot.cuda_devices);
      }
    }
    if (slot.threads_per_rank > 0) {
      spec.extra_env.push_back("OMP_NUM_THREADS=" + std::to_string(slot.threads_per_rank));
    }
    // Its neighbours: every trial running now, and every trial that starts before it ends.
    std::set<int64_t>& neighbours = running_[r.id];
    neighbours.clear();
    for (auto& [other, others] : running_) {
      if (other == r.id) continue;
      neighbours.insert(other);
      others.insert(r.id);
    }
    running_threads_[r.id] = pthread_self();
    load.start_load_1m = load_average_1m();
    r.started_at = utc_now();
    auto free_slot = [&] {
      running_threads_.erase(r.id);
      slot_busy_[index] = 0;
      --busy_;
      if (alone) alone_running_ = false;
      slot_freed_.notify_all();
    };
    lock.unlock();
    try {
      outcome = settings_.runner->run(spec);
    } catch (const UserError& err) {  // its run directory could not be written: it failed
      lock.lock();
      free_slot();
      running_.erase(r.id);
      return not_started(r, key, err.what());
    } catch (...) {
      lock.lock();
      free_slot();
      running_.erase(r.id);
      throw;
    }
    lock.lock();
    free_slot();
    if (outcome.status == "running") {  // a signal: every other trial stops too
      running_.erase(r.id);
      stop_all(outcome.interrupt_signal != 0 ? outcome.interrupt_signal : SIGTERM);
      throw Interrupted(outcome.interrupt_signal);
    }
    if (outcome.node_failure.empty()) break;
    slot_retired_[index] = 1;
    running_.erase(r.id);
    std::fprintf(stderr, "slot %s taken out of use: trial #%lld ended by a node failure (%s)\n",
                 slot.label.c_str(), static_cast<long long>(r.id),
                 outcome.node_failure.c_str());
    std::fflush(stderr);
    failures += (failures.empty() ? "" : "; ") + ("node failure on " + slot.label + ": " +
                                                  outcome.node_failure);
    slot_freed_.notify_all();  // no slot left: the waiters learn it
  }
  if (!failures.empty()) r.reason = "run again after a " + failures;
  load.end_load_1m = load_average_1m();
  trial::apply_outcome(outcome, &r);
  r.finished_at = utc_now();
  store_.finish_trial(r, outcome.steps, outcome.phases);
  store_.record_trial_load(load);
  if (const auto it = running_.find(r.id); it != running_.end()) {
    if (!it->second.empty()) {
      store_.record_neighbours(r.id, std::vector<int64_t>(it->second.begin(), it->second.end()));
    }
    running_.erase(it);
  }
  const search::RunOutcome o = outcome_of(r);
  note_best(r, o);

  std::string detail;
  if (r.status == "ok") {
    // The peak on the report's basis, named as the report names it ("RSS" on CPU) with its
    // basis (results/memory_basis.h).
    const std::string label = report::peak_label({r});  // "RSS above baseline"
    char text[256];
    std::snprintf(text, sizeof text, "%.0f tok/s/rank, %s %s %s, %.1f s", o.value,
                  label.substr(0, label.find(' ')).c_str(),
                  report::memory_size(report::peak_above_baseline(r)).c_str(),
                  report::trial_basis(r).c_str(), outcome.wall_s);
    detail = text;
    if (o.result == search::Result::kOom) detail += " (over the head-room)";
  } else {
    detail = "(" + r.error.substr(0, 100) + ")";
  }
  progress_.finished("#" + std::to_string(r.id) + " " + key, r.status,
                     r.slot.empty() ? detail : detail + " [" + r.slot + "]");
  ++(r.probe ? counted_.probes : counted_.runs);
  return o;
}

search::RunOutcome SweepHost::not_started(store::TrialRecord& r, const std::string& key,
                                          const std::string& error) {
  r.status = "failed";
  r.error = error;
  r.finished_at = utc_now();
  store_.finish_trial(r, {}, {});
  std::string name = "#";  // "#12 <key>"
  name += std::to_string(r.id);
  name += ' ';
  name += key;
  progress_.finished(name, r.status, "(" + r.error + ")");
  ++(r.probe ? counted_.probes : counted_.runs);
  search::RunOutcome failed;  // kFailed: says nothing about memory
  failed.trial_id = r.id;
  return failed;
}

void SweepHost::record(const search::Point& p, int64_t length, const std::string& status,
                       const std::string& reason) {
  const std::lock_guard<std::mutex> lock(mutex_);
  store::TrialRecord r = base_record(p, length, false);
  if (length == 0) r.key = search::describe(space_, p) + " all lengths";
  r.status = status;
  r.reason = reason;
  written_.insert(r.key);
  // Stored without a config when the length breaks a rule (a skipped or pruned trial at a length
  // only run() finds invalid); an invalid point whose backend refuses it keeps its mesh.
  if (std::optional<experiment::TrialPlan> plan =
          try_plan(p, length > 0 ? length : space_.lengths.front())) {
    fill_plan(*plan, &r);
    if (status != "invalid" && experiment::point_backend(space_, p) == backends::kNativeBackend) {
      predict(plan->config, &r);
    }
  }
  store_.add_trial(r);
  progress_.not_run(r.key, status, reason);
  if (status == "invalid" && length == 0) {
    // Rows of this point an earlier run left `running` (e.g. a version that called it valid)
    // are never re-run: settle them with the reason.
    const std::string prefix = search::describe(space_, p) + " L=";
    for (auto& [key, previous] : previous_) {
      if (previous.status != "running" || key.rfind(prefix, 0) != 0) continue;
      previous.status = "invalid";
      previous.reason = reason;
      previous.finished_at = utc_now();
      store_.finish_trial(previous, {}, {});
    }
  }
  if (status == "pruned") ++counted_.pruned;
  if (status == "skipped") ++counted_.skipped;
  if (status == "invalid") ++counted_.invalid;
}

void SweepHost::settle_unvisited() {
  const std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [key, previous] : previous_) {
    if (previous.status != "running" || written_.count(key)) continue;
    previous.status = "skipped";
    previous.reason = "not re-run by the resumed sweep";
    previous.finished_at = utc_now();
    store_.finish_trial(previous, {}, {});
    progress_.not_run(key, previous.status, previous.reason);
  }
}

void SweepHost::predict(const config::RunConfig& c, store::TrialRecord* r) const {
  r->predicted_peak_bytes = plan::predict_peak_bytes(model_, c);
  // A probe computes attention in one layer only: its time is not a step's.
  if (!r->probe) r->predicted_step_ms = plan::predict_step_ms(model_, hardware_, c);
}

std::optional<double> SweepHost::predicted_value(const search::Point& p, int64_t length) {
  const std::lock_guard<std::mutex> lock(mutex_);
  try {
    const experiment::TrialPlan plan =
        experiment::plan_trial(e_, space_, p, length, false, "unused");
    const double step_ms = plan::predict_step_ms(model_, hardware_, plan.config);
    if (!(step_ms > 0)) return std::nullopt;
    const double tokens = static_cast<double>(plan.config.sequence.length) *
                          static_cast<double>(plan.config.sequence.micro_batch *
                                              plan.config.sequence.grad_accum * plan.config.mesh.dp);
    return tokens / (step_ms / 1000.0) / static_cast<double>(e_.world_size);  // tok/s/rank
  } catch (const UserError&) {
    return std::nullopt;
  }
}

bool SweepHost::budget_left() {
  const std::lock_guard<std::mutex> lock(mutex_);
  // A run allowed here counts until run() begins it (runs on other slots may ask meanwhile).
  if (e_.budget.max_trials > 0 && started_ + replayed_ + reserved_ >= e_.budget.max_trials) {
    return false;
  }
  if (e_.budget.wall_clock_s > 0 && progress_.elapsed_s() >= e_.budget.wall_clock_s) return false;
  ++reserved_;
  return true;
}

}  // namespace ulysses::sweep
