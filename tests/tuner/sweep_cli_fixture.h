// The fixture of the ulysses-tune end-to-end tests: a temporary directory, the fake trainer
// (fake_trainer.sh: a synthetic memory function, exit 12 when over the limit) and its experiment,
// and ulysses-tune run as a process with its output captured.
#pragma once
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/paths.h"
#include "common/remove_tree.h"
#include "support/test_files.h"
#include "tuner/store/store.h"
#include "tuner/store/sweep_store.h"

namespace ulysses::sweep {

namespace fs = std::filesystem;

// The fake's memory (MiB) = 100 + L / sp / 4 x (0.5 tiled loss) x (0.6 offload) under
// 0.9 x 1 GiB = 921.6 MiB (head-room 0.1): sp 4 with both savings fits the longest length.
constexpr const char* kExperiment = R"(name: fake
hardware: cpu-local
world_size: 4
memory_limit_gib: 1.0
headroom: 0.1
base:
  model: {hidden_size: 32, num_layers: 1, num_heads: 4, num_kv_heads: 2, intermediate_size: 64,
          vocab_size: 128}
  train: {device: cpu, steps: 5}
space:
  mesh.sp: auto
  memory.tiled_loss: [1, 8]
  memory.offload: [none, activations]
  sequence.length: {search: max, from: 1024, to: 32768, step: 1024}
objective: max-seqlen
budget: {trial_timeout_s: 30}
trial: {warmup_steps: 1, steps: 2}
)";

using testing::read_text;

struct Result {
  int status = -1;
  std::string out, err;
};

class SweepCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("sweep-cli-" + std::to_string(getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    ulysses::remove_tree(dir_);
    fs::create_directories(dir_);
    tune_ = sibling_binary("ulysses-tune");
    fake_ = (fs::path(project_home()) / "tests/tuner/fake_trainer.sh").string();
    db_ = (dir_ / "results.db").string();
    experiment_ = (dir_ / "fake.yaml").string();
    std::ofstream(experiment_) << kExperiment;
  }
  void TearDown() override { ulysses::remove_tree(dir_); }

  // Runs ulysses-tune with `args` (and environment assignments in `env`), capturing its output.
  Result tune(const std::string& args, const std::string& env = "") {
    return shell(env + " '" + tune_ + "' " + args);
  }
  // Runs a whole shell command line (e.g. `cd DIR && ...`), capturing its output.
  Result shell(const std::string& line) {
    const std::string cmd = "(" + line + ") > '" + (dir_ / "out").string() + "' 2> '" +
                            (dir_ / "err").string() + "'";
    const int raw = std::system(cmd.c_str());
    Result r;
    r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
    r.out = read_text(dir_ / "out");
    r.err = read_text(dir_ / "err");
    return r;
  }
  std::string sweep_args(const std::string& extra = "") const {
    return "sweep '" + experiment_ + "' --db '" + db_ + "' --trainer '" + fake_ + "' " + extra;
  }
  std::vector<store::TrialRecord> trials(const std::string& sweep_name) {
    store::Store store = store::Store::open(db_);
    store::SweepStore sweeps(store.db());
    return sweeps.trials(sweeps.find_sweep(sweep_name)->id);
  }
  static int64_t count(const std::vector<store::TrialRecord>& trials, const std::string& status,
                       bool only_real = false) {
    int64_t n = 0;
    for (const auto& t : trials) n += t.status == status && !(only_real && t.probe);
    return n;
  }

  fs::path dir_;
  std::string tune_, fake_, db_, experiment_;
};

}  // namespace ulysses::sweep
