// The runner kinds behind one interface (see runner.h).
#include "tuner/trial/runner.h"

#include "common/error.h"
#include "tuner/trial/srun_runner.h"

namespace ulysses::trial {
namespace {

// runner: local — the ranks as child processes of this machine (run_trial).
class LocalRunner : public TrialRunner {
 public:
  TrialOutcome run(const TrialSpec& spec) override { return run_trial(spec); }
  std::string kind() const override { return "local"; }
};

}  // namespace

std::unique_ptr<TrialRunner> make_trial_runner(const std::string& kind) {
  if (kind == "local") return std::make_unique<LocalRunner>();
  if (kind == "srun") return std::make_unique<SrunRunner>();
  throw UserError("runner: expected local or srun, got '" + kind + "'");
}

}  // namespace ulysses::trial
