// The cost model fitted as `plan --fit` fits it, offline, on a real GPU sweep: the 12 trials of
// the quick campaign on one H200 (tests/tuner/data/h200-quick-sweep-trials.csv says where they
// come from), four of them with the optimizer offloaded to the host. Every trial's step time
// within 15 % of the fit, also when the trial is left out of the fit, and its peak within 10 %;
// the 12 trials of a second sweep of the same space on the same machine under the fit of the
// first; and the comparison runs' allocated and reserved peaks with no fitted coefficient.
//
// Peaks of the fully offloaded trials with the loss tiled automatically (11: 8K, 12: 64K) were
// +14.2 % and -15.5 % off before two corrections, each read off the trainer's code:
//  - the loss tile holds 8 B per logit at once (sp/tiled_logits_loss.cpp: the fp32 logits and
//    their softmax, the logits freed once the softmax exists, the bf16 logit gradient in their
//    place), not the 14 B of the loss before it was rewritten in three passes: 1.5 GiB less at
//    8K, where the loss tile sets the peak (trial 11 too high);
//  - CUDA's caching allocator keeps the layers' blocks (at most fp32 [T, h], 512 MiB at 64K)
//    reserved while the loss asks for 1 GiB blocks none of them can hold: the reserved peak holds
//    the layers' working set beside the loss tile, 2.5 GiB at 64K (trial 12 too low).
// The comparison runs confirm both apart: the model without fitted coefficients is within 1 % of
// the allocated peak of the tiled and ALST runs and within 5 % of every reserved peak.
// Per trial, fit on the 12 trials of run limit130 (memory and time, in %):
//   trial  length tiled_loss offload      memory before  after   time before  after
//       1    8192  1         none              -3.4      -3.2          +0.1   +0.1
//       2   65536  1         none              +9.0      +8.7          -2.8   -2.8
//       3    8192  1         activations       -4.8      -4.6          -0.8   -0.8
//       4   65536  1         activations       +9.3      +9.1          -3.3   -3.3
//       5    8192  1         both              -5.5      -2.4          +0.6   +0.6
//       6   65536  1         both              -4.6      -4.4          -1.3   -1.3
//       7    8192  auto      none              +2.6      -1.7          +0.4   +0.4
//       8   65536  auto      none              -3.7      -1.0          +2.5   +2.5
//       9    8192  auto      activations       +1.0      -3.2          +0.3   +0.3
//      10   65536  auto      activations       -6.4      -3.0          +2.5   +2.5
//      11    8192  auto      both             +14.2      +5.0          -0.7   -0.7
//      12   65536  auto      both             -15.5      -1.7          +2.1   +2.1
// (Time is the same fit before and after: the memory model has no part in it.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/paths.h"
#include "config/run_config.h"
#include "tuner/costmodel/calibration.h"
#include "tuner/costmodel/memory_model.h"
#include "tuner/costmodel/time_model.h"

namespace ulysses::costmodel {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;
constexpr double kTimeTolerance = 0.15, kMemoryTolerance = 0.10;
// The comparison runs without fitted coefficients: allocated peaks within 2 % (the worst +0.8 %),
// reserved within 6 % (the worst, tiled at 32K, +5.0 %: with the checkpoints on the device the
// forward stores them in blocks its working set freed, so fewer layer blocks stay idle beside
// the loss than the model's cached layer blocks).
constexpr double kAllocatedTolerance = 0.02, kReservedTolerance = 0.06;
// The H200 profile's host link (profiles/hardware/h200.yaml: 64 GB/s) at the 0.8 efficiency the
// planner assumes, the upload's known rate as plan --fit takes it from the profile.
constexpr double kUploadMsPerGb = 1000.0 / (0.8 * 64.0);

struct Trial {
  std::string run;
  int trial = 0;
  config::RunConfig config;
  double step_ms = 0, peak_bytes = 0;
};

// The sweep's base (its experiment) with the trial's point, as the sweep ran it.
config::RunConfig trial_config(int64_t seqlen, const std::string& tiled_loss,
                               const std::string& offload, const std::string& limit_gib) {
  const bool activations = offload == "activations" || offload == "both";
  const bool optimizer = offload == "both";
  std::ostringstream yaml;
  yaml << "model: {preset: llama-3.2-1b}\n"
       << "sequence: {length: " << seqlen << ", micro_batch: 1, grad_accum: 1}\n"
       << "memory: {precision: bf16, checkpointing: true, tiled_mlp: auto, tiled_loss: "
       << tiled_loss << ", offload_activations: " << (activations ? "true" : "false")
       << ", offload_optimizer: " << (optimizer ? "true" : "false") << ", limit_gib: " << limit_gib
       << "}\n"
       << "train: {device: cuda, steps: 3}\n";
  return config::parse_run_config_yaml(yaml.str());
}

// The cells of tests/tuner/data/<file>'s rows: '#' comments, blank lines and the header left out.
std::vector<std::vector<std::string>> csv_rows(const std::string& file) {
  std::ifstream in(project_home() + "/tests/tuner/data/" + file);
  std::vector<std::vector<std::string>> rows;
  std::string line;
  bool header = true;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    if (header) {
      header = false;
      continue;
    }
    std::stringstream cells(line);
    rows.emplace_back();
    for (std::string cell; std::getline(cells, cell, ',');) rows.back().push_back(cell);
  }
  return rows;
}

std::vector<Trial> load_trials(const std::string& run) {
  std::vector<Trial> trials;
  for (const std::vector<std::string>& f : csv_rows("h200-quick-sweep-trials.csv")) {
    if (f.size() != 8 || f[0] != run) continue;
    Trial t;
    t.run = f[0], t.trial = std::stoi(f[1]);
    t.config = trial_config(std::stoll(f[2]), f[3], f[4], f[5]);
    t.step_ms = std::stod(f[6]), t.peak_bytes = std::stod(f[7]) * kMiB;
    trials.push_back(t);
  }
  return trials;
}

struct Fitted {
  MemoryCoefficients memory;
  TimeCoefficients time;
};

Fitted fit(const std::vector<Trial>& trials) {
  std::vector<Measured> mem, time;
  for (const Trial& t : trials) {
    mem.push_back({t.config, t.peak_bytes});
    time.push_back({t.config, t.step_ms});
  }
  TimeCoefficients base;
  base.ms_per_gb_upload = kUploadMsPerGb;
  return {fit_memory(mem), fit_time(time, base)};
}

double time_error(const Fitted& f, const Trial& t) {
  return predict_time(step_work(t.config), f.time).step_ms / t.step_ms - 1;
}
double memory_error(const Fitted& f, const Trial& t) {
  return static_cast<double>(predict_memory(t.config, f.memory).peak_bytes) / t.peak_bytes - 1;
}

void expect_within(const Fitted& f, const std::vector<Trial>& trials, const std::string& what,
                   bool check_memory = true) {
  for (const Trial& t : trials) {
    const double dt = time_error(f, t), dm = memory_error(f, t);
    std::printf("%-10s %-10s trial %2d  time %+6.1f %%  memory %+6.1f %%\n", what.c_str(),
                t.run.c_str(), t.trial, 100 * dt, 100 * dm);
    EXPECT_LE(std::fabs(dt), kTimeTolerance) << what << ": " << t.run << " trial " << t.trial;
    if (!check_memory) continue;
    EXPECT_LE(std::fabs(dm), kMemoryTolerance) << what << ": " << t.run << " trial " << t.trial;
  }
}

// Fitted from these 12 trials: time at most 4 coefficients (ms per GEMM TFLOP, per attention
// TFLOP, per GB of the offloaded optimizer's host passes, and the per-step overhead where these
// trials tell it apart from the rest; communication is zero at one rank, the upload's rate comes
// from the profile's host link), memory 2 (runtime bytes, allocator fraction). 12 trials for
// 4 + 2 coefficients: the leave-one-out test below holds each trial out of its own time fit.
TEST(GpuFit, PlanFitOnTheH200SweepHoldsEveryTrial) {
  const std::vector<Trial> trials = load_trials("limit130");
  ASSERT_EQ(trials.size(), 12u);
  const Fitted f = fit(trials);
  std::printf("memory: runtime %.0f MiB, allocator overhead %+.1f %%\n",
              f.memory.runtime_bytes / kMiB, 100 * f.memory.allocator_fraction);
  std::printf("time: %.2f ms/GEMM-TFLOP, %.2f ms/attention-TFLOP, overhead %.1f ms, host pass "
              "%.2f ms/GB, upload %.2f ms/GB\n",
              f.time.ms_per_tflop, f.time.ms_per_tflop_attention, f.time.overhead_ms,
              f.time.ms_per_gb_host, f.time.ms_per_gb_upload);
  expect_within(f, trials, "fit");
  // The offloaded optimizer's phase at 8K, measured by the trainer's timers in the same campaign
  // (16 host threads): 419.5 ms = norm 63.9 + host update 305.1 + upload 49.6 (+ 0.1 download).
  // The fit sees only step times; its phase must still be that phase.
  const Trial& offloaded = trials[10];  // trial 11: 8K, tiled loss auto, both offloaded
  ASSERT_EQ(offloaded.trial, 11);
  const TimePrediction p = predict_time(step_work(offloaded.config), f.time);
  std::printf("optimizer phase: norm %.1f + host update %.1f + upload %.1f = %.1f ms\n",
              p.optimizer_norm_ms, p.optimizer_update_ms, p.optimizer_upload_ms, p.optimizer_ms);
  EXPECT_NEAR(p.optimizer_ms, 419.5, 0.15 * 419.5);
  EXPECT_NEAR(p.optimizer_upload_ms, 49.6, 0.15 * 49.6);
}

TEST(GpuFit, EachTrialLeftOutOfTheFitIsPredicted) {
  const std::vector<Trial> trials = load_trials("limit130");
  for (size_t out = 0; out < trials.size(); ++out) {
    std::vector<Trial> rest;
    for (size_t i = 0; i < trials.size(); ++i) {
      if (i != out) rest.push_back(trials[i]);
    }
    // Memory is not held out (no memory term is fitted beyond plan --fit's offset and scale):
    // trial 11 held out comes out +14.8 % (the one small 8K peak places the offset), trials 2
    // and 4 +10.6 and +11.2 %. Those two ran at their limit: under 130 GiB they peak 16 GiB
    // lower than under 139.8 (the allocator frees its cache at the cap), so they pull the fit's
    // scale below 1 (allocator overhead -6.5 %, offset 1.7 GiB); without them the fit is
    // -1.6 % and 1.1 GiB, and every trial held out is within 5.2 %.
    expect_within(fit(rest), {trials[out]}, "held out", /*check_memory=*/false);
  }
}

TEST(GpuFit, TheSecondSweepIsPredictedByTheFitOfTheFirst) {
  const Fitted f = fit(load_trials("limit130"));
  const std::vector<Trial> second = load_trials("limit139.8");
  ASSERT_EQ(second.size(), 12u);
  expect_within(f, second, "other run");
}

// The comparison's runs on the same H200 (tests/tuner/data/h200-quick-compare-peaks.csv), with
// the allocator's own peaks apart: the model with no fitted coefficient (no runtime, no overhead
// fraction) against the allocated peak, less the cached layer blocks (blocks the allocator holds
// but has not handed out), and against the reserved peak with them.
TEST(GpuFit, TheModelPredictsTheAllocatorsPeaksOfTheCompareRuns) {
  MemoryCoefficients bare;
  bare.runtime_bytes = 0, bare.allocator_fraction = 0;
  int rows = 0;
  for (const std::vector<std::string>& f : csv_rows("h200-quick-compare-peaks.csv")) {
    ASSERT_EQ(f.size(), 5u) << f[0];
    const std::string& name = f[0];
    const bool tiled = name != "plain", offloaded = name == "alst";
    std::ostringstream yaml;
    yaml << "model: {preset: llama-3.2-1b}\n"
         << "sequence: {length: " << f[1] << ", micro_batch: 1, grad_accum: 1}\n"
         << "memory: {precision: bf16, checkpointing: " << (tiled ? "true" : "false")
         << ", tiled_mlp: " << (tiled ? "auto" : "1") << ", tiled_loss: " << (tiled ? "auto" : "1")
         << ", offload_activations: " << (offloaded ? "true" : "false")
         << ", offload_optimizer: " << (offloaded ? "true" : "false") << "}\n"
         << "train: {device: cuda, steps: 3}\n";
    const MemoryPrediction p = predict_memory(config::parse_run_config_yaml(yaml.str()), bare);
    double cached = 0;
    for (const MemoryTerm& t : p.terms) {
      if (t.name == "cached layer blocks") cached = static_cast<double>(t.bytes);
    }
    const double allocated = std::stod(f[2]) * kMiB, reserved = std::stod(f[3]) * kMiB;
    const double da = (p.peak_bytes - cached) / allocated - 1, dr = p.peak_bytes / reserved - 1;
    std::printf("compare %-5s %6s  allocated %+6.2f %%  reserved %+6.2f %%\n", name.c_str(),
                f[1].c_str(), 100 * da, 100 * dr);
    // The plain loss's logits count the reserved view (the bf16 logits' block beside three fp32
    // ones: 14 B per logit, 12 B of them allocated at once): only the reserved peak there.
    if (tiled) {
      EXPECT_LE(std::fabs(da), kAllocatedTolerance) << name << " " << f[1];
    }
    EXPECT_LE(std::fabs(dr), kReservedTolerance) << name << " " << f[1];
    ++rows;
  }
  EXPECT_EQ(rows, 5);
}

}  // namespace
}  // namespace ulysses::costmodel
