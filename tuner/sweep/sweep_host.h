// The search engine's Host for a real sweep: plans each trial's run config from the experiment,
// prunes with the memory model, stores the cost model's predictions beside each trial and
// predicts the objective to order the search, runs trials as real ulysses-train ranks
// (trial/trial_runner.h) or, for a point of the deepspeed backend, as transformers + DeepSpeed
// ranks (backends/deepspeed/deepspeed_trial.h; neither pruned nor predicted: the cost model is
// ulysses-train's), stores every result in its own transaction with the machine's load average
// at the trial's start and end (store::TrialLoad), replays finished trials on
// --resume, enforces the budget and prints progress.
#pragma once
#include <cstdint>
#include <map>
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
