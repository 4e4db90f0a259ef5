// Experiment files (tuner/experiment/): parsing and one-line errors, sweep names, the YAML size
// limit, the space with mesh.sp: auto and shorthands, memory orders and which of them cost time,
// the run config of a trial, what decides trial results (for --resume); the memory model's lower
// bound.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "common/error.h"
#include "common/paths.h"
#include "config/run_config.h"
#include "config/yaml_reader.h"
#include "tuner/costmodel/memory_model.h"
#include "tuner/experiment/experiment.h"
#include "tuner/experiment/result_inputs.h"
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
  // The hardware profile's peak for the precision (cpu-local), for MFU in summary.json.
  EXPECT_DOUBLE_EQ(plan.config.profile.peak_tflops, 0.147);  // fp32
  std::string bf16_text = kValid;
  const std::string base = "base: {train: {device: cpu";
  bf16_text.replace(bf16_text.find(base), base.size(),
                    "base: {memory: {precision: bf16}, train: {device: cuda");
  const Experiment bf16 = parse_experiment(bf16_text, "x.yaml", profiles());
  EXPECT_DOUBLE_EQ(plan_trial(bf16, build_space(bf16), {1, 1, 1}, 2048, false, "o")
                       .config.profile.peak_tflops,
                   0.294);
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

// mesh.sp: auto over 6 ranks of the tiny model (8 query heads, 2 KV heads): sp 1 and 2 split
// the heads evenly; with mesh.uneven_heads in the space (or the base) sp 3 and 6 are meshes too.
TEST(Experiment, AutoSpIncludesUnevenSplitsWhenAsked) {
  auto sp_values = [](const std::string& text) {
    const Experiment e = parse_experiment(text, "x.yaml", profiles());
    for (const search::Axis& axis : build_space(e).axes) {
      if (axis.key == "mesh.sp") return axis.values;
    }
    return std::vector<std::string>{};
  };
  std::string six = kValid;
  six.replace(six.find("world_size: 4"), 13, "world_size: 6");
  EXPECT_EQ(sp_values(six), (std::vector<std::string>{"1", "2"}));
  std::string in_space = six;
  in_space.replace(in_space.find("  mesh.sp: auto\n"), 16,
                   "  mesh.sp: auto\n  mesh.uneven_heads: [false, true]\n");
  EXPECT_EQ(sp_values(in_space), (std::vector<std::string>{"1", "2", "3", "6"}));
  std::string in_base = six;
  in_base.replace(in_base.find("base: {"), 7, "base: {mesh: {uneven_heads: true}, ");
  EXPECT_EQ(sp_values(in_base), (std::vector<std::string>{"1", "2", "3", "6"}));
}

// 3 query heads over 1 KV head on 4 ranks: sp 2 and 4 need a ring (or, sp 2, an uneven split).
// mesh.sp: auto weighs every mesh.sp_ring value the space lists, whatever the base's, so sp 2
// and 4 are meshes, and their points at the other sp_ring values are invalid with the reason.
// A base that only the space's mesh.sp_ring makes valid is fine; one nothing makes valid is
// refused with a hint that can help (uneven heads cannot give 4 ranks 3 query heads).
TEST(Experiment, AutoSpWeighsEveryRingTheSpaceLists) {
  const std::string three =
      "name: t\nhardware: cpu-local\nworld_size: 4\nmemory_limit_gib: 2\n"
      "base:\n  model: {hidden_size: 24, num_layers: 1, num_heads: 3, num_kv_heads: 1, "
      "intermediate_size: 64, vocab_size: 128}\n  train: {device: cpu}\n";
  const std::string lengths = "  sequence.length: [1024]\n";
  const Experiment e = parse_experiment(
      three + "space:\n  mesh.sp: auto\n  mesh.sp_ring: [1, 2, 4]\n" + lengths, "x.yaml",
      profiles());
  const search::Space s = build_space(e);
  ASSERT_EQ(s.axes[0].key, "mesh.sp");
  EXPECT_EQ(s.axes[0].values, (std::vector<std::string>{"1", "2", "4"}));
  std::map<std::string, std::string> why;  // point -> "" or why it is invalid
  for (const search::Point& p : search::all_points(s)) {
    try {
      plan_trial(e, s, p, 1024, false, "o");
      why[search::describe(s, p)] = "";
    } catch (const UserError& err) {
      why[search::describe(s, p)] = err.what();
    }
  }
  int valid = 0;
  for (const auto& [point, reason] : why) valid += reason.empty();
  EXPECT_EQ(valid, 3);  // sp 1 x sp_ring 1, sp 2 x 2, sp 4 x 4
  EXPECT_EQ(why.at("mesh.sp=4 mesh.sp_ring=1"),
            "mesh.sp: 4 does not divide model.num_heads 3 (Ulysses gives each rank "
            "num_heads/sp query heads, and sp exceeds them; set mesh.sp_ring: auto (ring "
            "attention over the rest))");
  EXPECT_EQ(why.at("mesh.sp=4 mesh.sp_ring=2").rfind("mesh.sp_ring: 2 leaves an all-to-all", 0),
            0u);

  EXPECT_EQ(error_of(three + "  mesh: {sp: 4}\nspace:\n  mesh.sp_ring: [1, 4]\n" + lengths), "");
  EXPECT_EQ(error_of(three + "  mesh: {sp: 4}\nspace:\n  memory.tiled_mlp: [1, 2]\n" + lengths),
            "x.yaml: base: mesh.sp: 4 does not divide model.num_heads 3 (Ulysses gives each rank "
            "num_heads/sp query heads, and sp exceeds them; set mesh.sp_ring: auto (ring attention "
            "over the rest))");
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
  EXPECT_EQ(error_of(with("sequence.length: [2048, 1024]",
                          "sequence.length: {search: max, from: 1024, to: 4096, step: 1024, "
                          "curve: 17}")),
            "x.yaml: space.sequence.length.curve: must be 0 to 16 shorter lengths, got 17");
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

TEST(Experiment, BackendsBecomeTheFirstAxisAndNeverARunConfigKey) {
  // Only native: no backend axis, so a sweep's points and keys stay what they were.
  const search::Space native = build_space(parse_experiment(kValid, "x.yaml", profiles()));
  EXPECT_EQ(native.axes.front().key, "mesh.sp");
  EXPECT_EQ(point_backend(native, search::all_points(native).front()), "native");

  std::string text = kValid;
  text += "backend: [native, deepspeed]\n";
  const Experiment e = parse_experiment(text, "x.yaml", profiles());
  EXPECT_EQ(e.backends, (std::vector<std::string>{"native", "deepspeed"}));
  const search::Space s = build_space(e);
  ASSERT_EQ(s.axes.front().key, kBackendAxis);
  EXPECT_TRUE(s.axes.front().saving.empty());  // unordered: no dominance across backends
  EXPECT_EQ(search::all_points(s).size(), 2 * search::all_points(native).size());
  int deepspeed = 0;
  for (const search::Point& p : search::all_points(s)) {
    for (const std::string& o : point_overrides(s, p)) EXPECT_NE(o.rfind("backend", 0), 0u) << o;
    const TrialPlan plan = plan_trial(e, s, p, 1024, false, "out");  // a valid run config
    EXPECT_EQ(plan.config.sequence.length, 1024);
    deepspeed += point_backend(s, p) == "deepspeed";
  }
  EXPECT_EQ(deepspeed, static_cast<int>(search::all_points(native).size()));

  EXPECT_EQ(error_of(kValid + std::string("backend: megatron\n")),
            "x.yaml: backend: expected native or deepspeed (or a list of them), got 'megatron'");
  EXPECT_EQ(error_of(kValid + std::string("backend: [deepspeed, deepspeed]\n")),
            "x.yaml: backend: value 'deepspeed' listed twice");
  // Memory probes run attention in one layer only, which DeepSpeed cannot.
  auto replace = [](std::string text, const std::string& from, const std::string& to) {
    return text.replace(text.find(from), from.size(), to);
  };
  const std::string search_max = replace(
      replace(kValid, "sequence.length: [2048, 1024]",
              "sequence.length: {search: max, from: 1024, to: 4096, step: 1024}"),
      "objective: throughput\ntarget_length: 2048", "objective: max-seqlen");
  EXPECT_EQ(error_of(search_max), "");
  EXPECT_EQ(error_of(search_max + "backend: deepspeed\n").substr(0, 36),
            "x.yaml: search.probe: a memory probe");
  EXPECT_EQ(error_of(search_max + "backend: deepspeed\nsearch: {probe: false}\n"), "");
}

TEST(Experiment, SweepNamesAreOneDirectoryNameOfSafeCharacters) {
  for (const char* good : {"t", "node-8gpu_llama.8b", "A.b-C_9", "..x", "x.."}) {
    EXPECT_NO_THROW(check_sweep_name("--name", good)) << good;
  }
  // A line break would end a comment of a generated script; '/' and '..' leave runs/.
  for (const char* bad : {"x\ntouch pwned", "../evil", "a/b", ".", "..", "", "a b", "x\r",
                          "$(id)", "x;y", "'q'"}) {
    try {
      check_sweep_name("--name", bad);
      ADD_FAILURE() << "accepted: " << bad;
    } catch (const UserError& err) {
      const std::string what = err.what();
      EXPECT_EQ(what.rfind("--name: ", 0), 0u) << what;
      EXPECT_EQ(what.find_first_of("\r\n"), std::string::npos) << what;
    }
  }
  std::string text = kValid;
  text.replace(text.find("name: t\n"), 8, "name: \"x\\ntouch pwned\"\n");
  const std::string what = error_of(text);
  EXPECT_EQ(what.rfind("x.yaml: name: 'x\\x0atouch pwned' is not a sweep name", 0), 0u) << what;
  EXPECT_EQ(what.find('\n'), std::string::npos);
  text = kValid;
  text.replace(text.find("name: t\n"), 8, "name: ../up\n");
  EXPECT_EQ(error_of(text).rfind("x.yaml: name: '../up' is not a sweep name", 0), 0u);
}

// A YAML file over 16 MiB (experiment or run config) is refused in one line before it is parsed.
TEST(Experiment, YamlFilesOverTheSizeLimitAreRefused) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("experiment-size-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string big = (dir / "big.yaml").string();
  const std::string kOverLimit = ": 16.0 MiB is over the 16 MiB limit of a YAML document";
  {
    std::ofstream out(big);
    out << kValid << "# " << std::string(config::kMaxYamlBytes, 'x') << "\n";
  }
  try {
    load_experiment(big, profiles());
    ADD_FAILURE() << "a 16 MiB experiment was read";
  } catch (const UserError& err) {
    EXPECT_EQ(std::string(err.what()), big + kOverLimit);
  }
  try {
    config::load_run_config(big);
    ADD_FAILURE() << "a 16 MiB run config was read";
  } catch (const UserError& err) {
    EXPECT_EQ(std::string(err.what()), big + kOverLimit);
  }
  EXPECT_THROW(config::parse_yaml(std::string(config::kMaxYamlBytes + 1, ' '), "text"), UserError);
  std::filesystem::remove_all(dir);
}

TEST(Experiment, ZeroStageAndTiledLossSaveMemoryWithoutCostingTime) {
  std::string text = kValid;
  text.replace(text.find("  memory.offload: [none, both]\n"), 31,
               "  memory.offload: [none, both]\n  zero.stage: [0, 2, 3]\n"
               "  memory.tiled_loss: [1, auto]\n");
  const search::Space s = build_space(parse_experiment(text, "x.yaml", profiles()));
  ASSERT_EQ(s.axes.size(), 5u);
  EXPECT_EQ(s.axes[3].key, "zero.stage");
  EXPECT_EQ(s.axes[3].saving, (std::vector<int>{0, 2, 3}));  // the memory order stays
  EXPECT_FALSE(s.axes[3].saving_costs_time);
  EXPECT_FALSE(s.axes[4].saving_costs_time);  // memory.tiled_loss
  EXPECT_TRUE(s.axes[1].saving_costs_time);   // memory.tiled_mlp
  EXPECT_TRUE(s.axes[2].saving_costs_time);   // memory.offload
  // Stage 3 saves more than stage 0 but may be faster: a fit of stage 0 does not dominate it.
  EXPECT_TRUE(search::saves_at_least(s, {0, 0, 0, 2, 0}, {0, 0, 0, 0, 0}));
  EXPECT_FALSE(search::cannot_be_faster(s, {0, 0, 0, 2, 0}, {0, 0, 0, 0, 0}));
  EXPECT_TRUE(search::cannot_be_faster(s, {0, 1, 1, 2, 0}, {0, 0, 0, 2, 0}));
}

TEST(Experiment, ResultInputsNameWhatChangedButNotTheBudget) {
  const Experiment before = parse_experiment(kValid, "x.yaml", profiles());
  auto changed = [&](const std::string& from, const std::string& to) {
    std::string text = kValid;
    text.replace(text.find(from), from.size(), to);
    return first_difference(result_inputs(before),
                            result_inputs(parse_experiment(text, "x.yaml", profiles())));
  };
  EXPECT_EQ(changed("budget: {max_trials: 9, trial_timeout_s: 30}",
                    "budget: {max_trials: 90, wall_clock_s: 60, trial_timeout_s: 30}"),
            "");
  EXPECT_EQ(changed("name: t", "name: renamed"), "");
  EXPECT_EQ(changed("steps: 3}", "steps: 4}"), "trial.steps");
  EXPECT_EQ(changed("trial_timeout_s: 30", "trial_timeout_s: 60"), "budget.trial_timeout_s");
  EXPECT_EQ(changed("memory_limit_gib: 2", "memory_limit_gib: 3"), "memory_limit_gib");
  EXPECT_EQ(changed("steps: 7}}", "steps: 7}, memory: {checkpointing: true}}"),
            "base.memory.checkpointing");
  // Every key of the base counts, also one that each trial overrides.
  EXPECT_EQ(changed("steps: 7}}", "steps: 8}}"), "base.train.steps");
  EXPECT_EQ(changed("model: tiny", "model: tiny\nheadroom: 0.2"), "headroom");
  EXPECT_EQ(changed("[1, 4, auto]", "[1, auto]"), "space.memory.tiled_mlp");
  EXPECT_EQ(changed("  memory.offload: [none, both]\n", ""), "space");
  EXPECT_EQ(changed("[2048, 1024]", "[2048, 1024, 512]"), "space.sequence.length");
  // The model preset's contents are part of the resolved base, and digested for the sweep.
  const std::map<std::string, std::string> digests = profile_digests(before);
  EXPECT_EQ(digests.at("hardware_profile").rfind("fnv1a64:", 0), 0u);
  EXPECT_EQ(digests.at("model").size(), 8u + 16u);
  std::string text = kValid;
  text.replace(text.find("steps: 7}}"), 10, "steps: 7}, model: {num_layers: 3}}");
  EXPECT_NE(profile_digests(parse_experiment(text, "x.yaml", profiles())).at("model"),
            digests.at("model"));
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
    if (entry.path().filename() == "quickstart-cpu.yaml") {
      EXPECT_EQ(s.curve, 1);
    }
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
