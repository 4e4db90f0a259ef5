// How a sweep's trials start their ranks: one interface, two kinds. `local`
// runs the ranks as child processes of this machine (trial_runner.h); `srun` runs each trial as
// one SLURM job step inside the current allocation (srun_runner.h).
#pragma once
#include <memory>
#include <string>

#include "tuner/trial/trial_runner.h"

namespace ulysses::trial {

class TrialRunner {
 public:
  virtual ~TrialRunner() = default;
  // Runs one trial to its end; the contract of run_trial (trial_runner.h) for every kind: a failed
  // trial is a result ("running" when the caller was interrupted), never an exception.
  virtual TrialOutcome run(const TrialSpec& spec) = 0;
  // "local" | "srun".
  virtual std::string kind() const = 0;
};

// The runner of `kind` ("local" | "srun"). Throws UserError("runner: ...") for another kind, and
// for srun when srun is not on PATH or this process is not inside a SLURM allocation
// (SLURM_JOB_ID unset: run inside salloc / sbatch, or `ulysses-tune sweep --submit`).
std::unique_ptr<TrialRunner> make_trial_runner(const std::string& kind);

}  // namespace ulysses::trial
