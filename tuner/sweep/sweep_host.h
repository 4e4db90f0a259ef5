// The search engine's Host for a real sweep: plans each trial's run config from the experiment,
// prunes with the memory model, stores the cost model's predictions beside each trial and
// predicts the objective to order the search, runs trials as real ulysses-train ranks
// (trial/trial_runner.h) or, for a point of the deepspeed backend, as transformers + DeepSpeed
// ranks (backends/deepspeed/deepspeed_trial.h; neither pruned nor predicted: the cost model is
// ulysses-train's), stores every result in its own transaction with the machine's load average
// at the trial's start and end (store::TrialLoad), replays finished trials on
// --resume, enforces the budget and prints progress.
//
// Slots: with more than one (HostSettings::slots), the engine calls run() from one thread per
// slot. Each trial takes a free slot (its ranks pinned to the slot's cores with OMP_NUM_THREADS
// = cores / ranks, its devices, or its nodes), stores the slot's label, and the trials whose runs
// overlapped in time are stored as neighbours. Isolation: a trial that must run alone (an
// offloading trial under offload_alone, every trial under all_alone; runner local only: node
// slots share nothing) waits until no other slot is busy, and no trial starts beside it. Store
// calls, progress and every member are serialised by one mutex (the database connection is used
// by one thread at a time). SIGINT/SIGTERM caught by any trial's supervision, or by idle() on the
// thread that waits, stops every running trial (each stays `running`, re-run by --resume) and
// run() throws Interrupted. A trial that ends by a node failure (trial::TrialOutcome::node_failure)
// takes its slot out of use with one line on stderr and runs again on another slot; the note is
// kept in the trial's reason; when no slot is left, run() throws UserError "slots: ...".
#pragma once
#include <pthread.h>

#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>

#include "tuner/experiment/experiment.h"
#include "tuner/experiment/trial_space.h"
#include "tuner/results/calibrated_model.h"
#include "tuner/search/engine.h"
#include "tuner/store/sweep_store.h"
#include "tuner/sweep/progress.h"
#include "tuner/trial/runner.h"
#include "tuner/trial/slots.h"

namespace ulysses::sweep {

// Thrown by SweepHost::run when SIGINT/SIGTERM stopped a trial: the sweep ends `interrupted`
// and the trial stays `running` in the store (re-run by --resume).
struct Interrupted : std::runtime_error {
  explicit Interrupted(int signal) : std::runtime_error("interrupted"), signal(signal) {}
  int signal;
};

struct HostSettings {
  std::string runs_dir;  // trial i runs in <runs_dir>/<trial id>/
  std::string trainer;   // ulysses-train
  std::string python;    // the deepspeed backend's Python (backends/deepspeed/); "" = none
  trial::TrialRunner* runner = nullptr;  // runs each trial (local | srun); not owned, non-null
  int64_t expected_runs = 0;
  std::vector<trial::Slot> slots = {trial::Slot{}};  // trial/slots.h; one empty slot = as before
  std::string isolation = "offload_alone";           // offload_alone | shared | all_alone
};

// Invariants: sweep_id names an existing sweep; every trial it writes belongs to it.
class SweepHost : public search::Host {
 public:
  SweepHost(const experiment::Experiment& e, const search::Space& space, store::SweepStore& store,
            int64_t sweep_id, const HostSettings& settings);

  // invalid_point_reason at the space's first length.
  std::optional<std::string> invalid_reason(const search::Point& p) override;
  // nullopt also when `length` breaks a rule (run() then stores the trial `invalid`).
  std::optional<std::string> prune_reason(const search::Point& p, int64_t length) override;
  // A trial that cannot run at `length` (invalid_point_reason: a rule that depends on the
  // length) is stored `invalid` with its reason and not run (RunOutcome::ran false); one whose
  // files cannot be written (the DeepSpeed files, run_dir, run.yaml) is stored `failed` with the
  // error: the sweep goes on and no trial stays `running` (search::Result::kFailed).
  search::RunOutcome run(const search::Point& p, int64_t length, bool probe) override;
  // Stores the row with its run config and mesh where the point plans at `length` (the first
  // length for length 0), without them where that length breaks a rule. An `invalid` point
  // (length 0) also settles the rows of it that an earlier run of the sweep left `running`
  // (--resume): they are stored `invalid` with the reason.
  void record(const search::Point& p, int64_t length, const std::string& status,
              const std::string& reason) override;
  // Called once the search has finished (--resume): every row an earlier run left `running`
  // that this run did not write again (a point now skipped, or not revisited) is stored
  // `skipped`, "not re-run by the resumed sweep".
  void settle_unvisited();
  bool budget_left() override;
  // Predicted tokens/s per rank (the objective's metric) from the cost model, for ordering.
  std::optional<double> predicted_value(const search::Point& p, int64_t length) override;
  // Several slots: takes a pending SIGINT/SIGTERM (they are blocked in every thread, see
  // sweep_command.cpp), stops every running trial and throws Interrupted.
  void idle() override;

  // Called once the search has finished, when the sweep ran more than one slot: while the best
  // configuration by the objective (trials ranked as recommend ranks them, a re-measure standing
  // for the trial it re-measured) was measured with neighbours, runs it again with no other
  // trial running, stored as a new trial with remeasure_of set and key "<key> remeasure"; at
  // most `max_runs` times, and only while the budget has room. Returns the re-measures run (or
  // replayed on --resume).
  int64_t remeasure_best(int max_runs);
  // Trials replayed from the store instead of run (--resume).
  int64_t replayed() const { return replayed_; }
  // What the search did so far, counted as the engine counts it (search::Summary: runs and probes
  // that returned a result, replays included; pruned, skipped, invalid, invalid_at_length), so
  // that a sweep stopped by a signal or an error, whose engine summary is lost with the
  // exception, still reports it. grid_runs and budget_exhausted are not counted (0, false); a
  // trial stopped by the signal is not counted.
  search::Summary counted() const { return counted_; }
  // The id of the best fitting real trial so far by the experiment's objective, or 0.
  int64_t best_trial() const { return best_id_; }

 private:
  // run() for a key of the caller's (a re-measure's "<key> remeasure" with remeasure_of set:
  // it runs alone). REQUIRES: `lock` holds mutex_.
  search::RunOutcome run_point(std::unique_lock<std::mutex>& lock, const search::Point& p,
                               int64_t length, bool probe, const std::string& key,
                               std::optional<int64_t> remeasure_of);
  // Runs begun trial `r` (its plan, spec and load filled) on a slot until it ends other than by
  // a node failure, then stores it. REQUIRES: `lock` holds mutex_.
  search::RunOutcome run_on_slot(std::unique_lock<std::mutex>& lock, store::TrialRecord& r,
                                 const std::string& key, trial::TrialSpec spec, bool alone,
                                 store::TrialLoad load);
  // Waits for a free slot (alone: and no other busy) and returns its index. Throws Interrupted
  // once a signal stopped the sweep, UserError when no slot is left.
  size_t acquire_slot(std::unique_lock<std::mutex>& lock, bool alone);
  // Sends `signal` to every thread running a trial, and makes every later run() throw.
  void stop_all(int signal);
  bool must_run_alone(const config::RunConfig& c) const;
  store::TrialRecord base_record(const search::Point& p, int64_t length, bool probe);
  // The point's plan at `length` (output dir "unused"), or nullopt when it breaks a rule.
  std::optional<experiment::TrialPlan> try_plan(const search::Point& p, int64_t length);
  // Sets the record's config_yaml, dp and sp from `plan`.
  static void fill_plan(const experiment::TrialPlan& plan, store::TrialRecord* r);
  // Stores begun trial `r` `failed` with `error` (it could not start) and returns kFailed.
  search::RunOutcome not_started(store::TrialRecord& r, const std::string& key,
                                 const std::string& error);
  search::RunOutcome outcome_of(const store::TrialRecord& r);
  void note_best(const store::TrialRecord& r, const search::RunOutcome& o);
  int64_t trial_limit_bytes() const;
  // Stores the cost model's peak and step time beside the measurement to come (run or not).
  void predict(const config::RunConfig& c, store::TrialRecord* r) const;

  const experiment::Experiment& e_;
  const search::Space& space_;
  store::SweepStore& store_;
  int64_t sweep_id_;
  HostSettings settings_;
  bool on_cuda_ = false;
  // The newest fit in this sweep's database, else the defaults (plan/calibrated_model.h).
  plan::CalibratedModel model_;
  calibrate::HardwareProfile hardware_;
  std::map<std::string, store::TrialRecord> previous_;  // by key: what an earlier run stored
  std::set<std::string> written_;  // keys this run stored (run or recorded)
  Progress progress_;
  int64_t started_ = 0, replayed_ = 0;
  search::Summary counted_;
  int64_t best_id_ = 0, best_length_ = 0;
  double best_value_ = 0.0;

  // Slots and the runs on them; all guarded by mutex_.
  std::mutex mutex_;
  std::condition_variable slot_freed_;
  std::vector<char> slot_busy_, slot_retired_;
  int busy_ = 0;                // slots running a trial
  int alone_waiting_ = 0;       // trials waiting to run alone: no other trial starts meanwhile
  bool alone_running_ = false;
  int64_t reserved_ = 0;        // runs budget_left() allowed that run() has not begun yet
  int stop_signal_ = 0;         // set once a signal stopped the sweep
  std::map<int64_t, std::set<int64_t>> running_;  // trial id -> the trials that overlapped it
  std::map<int64_t, pthread_t> running_threads_;  // trial id -> the thread that runs it
};

// Why point `p` cannot run at `length`, as one line, or nullopt when it can: its run config breaks
// a rule (experiment::plan_trial), or its backend cannot run it (backends::deepspeed_refusal for
// the deepspeed backend: ring attention, an uneven head split, ..., the line the DeepSpeed export
// refuses with). `sweep --dry-run` and the search (SweepHost::invalid_reason, at the space's
// first length) both ask this, so they call the same points `invalid` for the same reason.
std::optional<std::string> invalid_point_reason(const experiment::Experiment& e,
                                                const search::Space& space, const search::Point& p,
                                                int64_t length);

// Now as UTC ISO 8601, "2026-11-22T14:25:29Z" (the store's timestamps).
std::string utc_now();

// The trial key: "<point> L=<length>[ probe]".
std::string trial_key(const search::Space& space, const search::Point& p, int64_t length,
                      bool probe);

}  // namespace ulysses::sweep
