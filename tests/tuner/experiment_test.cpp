// Experiment files (tuner/experiment/): parsing and one-line errors, the space with mesh.sp: auto
// and shorthands, memory orders, and the run config of a trial; the memory model's lower bound.
#include <gtest/gtest.h>

#include <filesystem>

#include "common/error.h"
#include "common/paths.h"
#include "tuner/costmodel/memory_model.h"
#include "tuner/experiment/experiment.h"
#include "tuner/experiment/trial_space.h"

namespace ulysses::experiment {
namespace {

std::string profiles() { return (std::filesystem::path(project_home()) / "profiles").string(); }

constexpr const char* kValid = R"(name: t
hardware: cpu-local
model: tiny
world_size: 4
memory_limit_gib: 2
base: {train: {device: cpu, steps: 7}}
space:
  mesh.sp: auto
  memory.tiled_mlp: [1, 4, auto]
  memory.offload: [none, both]
  sequence.length: [2048, 1024]
objective: throughput
target_length: 2048
budget: {max_trials: 9, trial_timeout_s: 30}
trial: {warmup_steps: 2, steps: 3}
)";

std::string error_of(const std::string& text) {
  try {
    Experiment e = parse_experiment(text, "x.yaml", profiles());
    build_space(e);
  } catch (const UserError& err) {
    return err.what();
  }
  return "";
}

TEST(Experiment, ParsesEveryKey) {
  const Experiment e = parse_experiment(kValid, "x.yaml", profiles());
  EXPECT_EQ(e.name, "t");
  EXPECT_EQ(e.world_size, 4);
  EXPECT_EQ(e.memory_limit_gib, 2.0);
  EXPECT_EQ(e.model, "tiny");
  EXPECT_EQ(e.axes.size(), 3u);
  EXPECT_EQ(e.lengths.values, (std::vector<int64_t>{1024, 2048}));
  EXPECT_FALSE(e.lengths.search_max);
  EXPECT_EQ(e.target_length, 2048);
  EXPECT_EQ(e.budget.max_trials, 9);
  EXPECT_EQ(e.warmup_steps, 2);
  EXPECT_EQ(e.measured_steps, 3);
}

TEST(Experiment, SpaceExpandsAutoAndKnowsMemoryOrders) {
  const Experiment e = parse_experiment(kValid, "x.yaml", profiles());
  const search::Space s = build_space(e);
  ASSERT_EQ(s.axes.size(), 3u);
  EXPECT_EQ(s.axes[0].values, (std::vector<std::string>{"1", "2", "4"}));  // tiny: hq 8, hkv 2
  EXPECT_TRUE(s.axes[0].saving.empty());
  EXPECT_EQ(s.axes[1].saving, (std::vector<int>{0, 1, 1}));
  EXPECT_EQ(s.axes[2].saving, (std::vector<int>{0, 2}));
  EXPECT_EQ(point_overrides(s, {2, 2, 1}),
            (std::vector<std::string>{"mesh.sp=4", "memory.tiled_mlp=auto",
                                      "memory.offload_activations=true",
                                      "memory.offload_optimizer=true"}));
}

TEST(Experiment, AutoLeavesOutMeshesTheHeadsCannotTake) {
  std::string text = kValid;
  text.replace(text.find("model: tiny"), 11, "model: tiny\nnproc: 8");
  text.replace(text.find("world_size: 4\n"), 14, "");
  text.replace(text.find("base: {"), 7,
               "base: {model: {num_heads: 6, num_kv_heads: 2, hidden_size: 192}, ");
  const search::Space s = build_space(parse_experiment(text, "x.yaml", profiles()));
  EXPECT_EQ(s.axes[0].values, (std::vector<std::string>{"1", "2"}));  // 4, 8 do not divide 6
}

TEST(Experiment, TrialConfigCarriesThePointAndTheTrialSettings) {
  const Experiment e = parse_experiment(kValid, "x.yaml", profiles());
  const search::Space s = build_space(e);
  const TrialPlan plan = plan_trial(e, s, {1, 1, 1}, 2048, /*probe=*/true, "/tmp/t/out");
  EXPECT_EQ(plan.config.mesh.sp, 2);
  EXPECT_EQ(plan.config.mesh.dp, 2);
  EXPECT_EQ(plan.config.memory.tiled_mlp.value, 4);
  EXPECT_TRUE(plan.config.memory.offload_activations);
  EXPECT_TRUE(plan.config.memory.offload_optimizer);
  EXPECT_EQ(plan.config.sequence.length, 2048);
  EXPECT_EQ(plan.config.train.steps, 5);
  EXPECT_EQ(plan.config.profile.warmup_steps, 2);
  EXPECT_DOUBLE_EQ(plan.config.memory.limit_gib, 1.8);  // CPU: 2 GiB less the 10% head-room
  EXPECT_EQ(plan.config.output.dir, "/tmp/t/out");
  EXPECT_TRUE(plan.config.attention.skip_all_but_last);
  EXPECT_EQ(plan.config.model.hidden_size, 256);  // the preset
  EXPECT_NE(plan.yaml.find("skip_all_but_last: true"), std::string::npos);
}

TEST(Experiment, InvalidPointsGiveTheirReason) {
  std::string text = kValid;
  text.replace(text.find("mesh.sp: auto"), 13, "mesh.sp: [3, 8]");
  const Experiment e = parse_experiment(text, "x.yaml", profiles());
  const search::Space s = build_space(e);
  try {
    plan_trial(e, s, {0, 0, 0}, 1024, false, "o");
    FAIL() << "sp 3 on 4 ranks accepted";
  } catch (const UserError& err) {
    EXPECT_EQ(std::string(err.what()).rfind("mesh.sp: 3 does not divide model.num_heads 8", 0), 0u);
  }
  EXPECT_THROW(plan_trial(e, s, {1, 0, 0}, 1024, false, "o"), UserError);  // sp 8 > 4 ranks
}

TEST(Experiment, BadInputIsOneLineNamingTheKey) {
  auto with = [](const std::string& from, const std::string& to) {
    std::string text = kValid;
    text.replace(text.find(from), from.size(), to);
    return text;
  };
  EXPECT_EQ(error_of(with("objective: throughput", "objektive: throughput")),
            "x.yaml: objektive: unknown key (did you mean objective?)");
  EXPECT_EQ(error_of(with("hardware: cpu-local", "hardware: tpu")),
            "x.yaml: hardware: no profile 'tpu' (looked for " + profiles() + "/hardware/tpu.yaml)");
  EXPECT_EQ(error_of(with("memory.tiled_mlp: [1, 4, auto]", "memory.tiled_mlp: []")),
            "x.yaml: space.memory.tiled_mlp: empty list of values");
  EXPECT_EQ(error_of(with("memory.offload: [none, both]", "memory.offload: [none, disk]")),
            "x.yaml: space.memory.offload: unknown value 'disk' (expected "
            "activations|both|none|optimizer)");
  EXPECT_EQ(error_of(with("memory.tiled_mlp", "memory.tiled_mpl")),
            "x.yaml: space.memory.tiled_mpl: unknown key (did you mean memory.tiled_mlp?)");
  EXPECT_EQ(error_of(with("sequence.length: [2048, 1024]",
                          "sequence.length: {search: max, from: 4096, to: 1024, step: 1}")),
            "x.yaml: space.sequence.length.to: 1024 is below from 4096");
  EXPECT_EQ(error_of(with("target_length: 2048", "target_length: 3000")),
            "x.yaml: target_length: 3000 is not in space.sequence.length");
  EXPECT_EQ(error_of(with("budget: {max_trials: 9", "budget: {max_trials: -1")),
            "x.yaml: budget.max_trials: must be >= 0 (0 = no limit)");
  EXPECT_EQ(error_of(with("base: {train: {device: cpu, steps: 7}}",
                          "base: {train: {device: gpu}}")).substr(0, 14),
            "x.yaml: base: ");
  EXPECT_EQ(error_of("name: t\nhardware: cpu-local\nspace: {}\n"),
            "x.yaml: space: empty: give at least sequence.length and one axis");
}

// The experiment files the project ships stay loadable, and every space has valid points.
TEST(Experiment, ShippedExperimentsLoad) {
  int files = 0;
  for (const auto& entry :
       std::filesystem::directory_iterator(std::filesystem::path(project_home()) / "experiments")) {
    if (entry.path().extension() != ".yaml") continue;
    ++files;
    const Experiment e = load_experiment(entry.path().string(), profiles());
    const search::Space s = build_space(e);
    int valid = 0;
    for (const search::Point& p : search::all_points(s)) {
      try {
        plan_trial(e, s, p, s.lengths.front(), false, "o");
        ++valid;
      } catch (const UserError&) {
      }
    }
    EXPECT_GT(valid, 0) << entry.path();
  }
  EXPECT_GE(files, 3);
}

TEST(MemoryModel, LowerBoundCountsStatesAndActivations) {
  const Experiment e = parse_experiment(kValid, "x.yaml", profiles());
  const search::Space s = build_space(e);
  const config::RunConfig plain = plan_trial(e, s, {0, 0, 0}, 2048, false, "o").config;
  const int64_t p = costmodel::parameter_count(plain.model);
  // tiny: V 1024, h 256, 2 layers of (q 256x256, k/v 256x64 each, o 256x256, mlp 3x256x512).
  EXPECT_EQ(p, 1024 * 256 * 2 + 2 * (2 * 256 * 256 + 2 * 256 * 64 + 3 * 256 * 512 + 2 * 256) + 256);
  const costmodel::MemoryEstimate est = costmodel::lower_bound_peak(plain);
  EXPECT_EQ(est.total_bytes(), 16 * p + 2 * 1 * 2048 * 256 * 4 + 1 * 2048 * 1024 * 4);
  // sp 4 divides the activations; a tiled loss drops the logits term.
  const config::RunConfig split = plan_trial(e, s, {2, 0, 0}, 2048, false, "o").config;
  EXPECT_LT(costmodel::lower_bound_peak(split).total_bytes(), est.total_bytes());
}

}  // namespace
}  // namespace ulysses::experiment
