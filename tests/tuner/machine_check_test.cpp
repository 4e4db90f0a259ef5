// A hardware profile against the machine (tuner/calibrate/machine_check.h): the per-rank limit a
// sweep uses, the one-line refusal of a profile that overstates the device before any trial, and
// the shipped GPU profiles against what CUDA reports on those devices.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "common/error.h"
#include "common/paths.h"
#include "tuner/calibrate/machine_check.h"
#include "tuner/sweep_cli_fixture.h"

namespace ulysses::sweep {
namespace {

using calibrate::HardwareProfile;
using calibrate::MachineCapacity;

std::string profile_path(const std::string& name) {
  return project_home() + "/profiles/hardware/" + name + ".yaml";
}

MachineCapacity h200_machine() {
  MachineCapacity m;
  m.device = "cuda:0", m.device_source = "nvidia-smi";
  m.device_memory_gib = 139.80;  // an H200 as CUDA reports it
  m.host_memory_gib = 125.0, m.host_cores = 16;
  return m;
}

std::string refusal(const HardwareProfile& hw, const MachineCapacity& m, double limit, bool given) {
  try {
    calibrate::checked_memory_limit_gib(hw, "h200.yaml", m, limit, given);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST(MachineCheck, TheLimitIsTheSmallerOfProfileAndDeviceAndAnOverstatementIsRefused) {
  HardwareProfile hw = calibrate::load_hardware_profile(profile_path("h200"));
  const MachineCapacity m = h200_machine();
  EXPECT_DOUBLE_EQ(calibrate::checked_memory_limit_gib(hw, "h200.yaml", m, 139.8, false), 139.8);
  hw.device_memory_gib = 140.40;  // the figure the first GPU sweep failed on: within rounding
  EXPECT_DOUBLE_EQ(calibrate::checked_memory_limit_gib(hw, "h200.yaml", m, 140.40, false), 139.8);
  hw.device_memory_gib = 150;
  const std::string line = refusal(hw, m, 150, false);
  EXPECT_EQ(line,
            "hardware: h200.yaml: device.memory_gib: 150.00 GiB is more than cuda:0 has "
            "(139.80 GiB, nvidia-smi); correct the profile or set memory_limit_gib <= 139.80 GiB "
            "in the experiment");
  // An explicit limit the device has: the sweep goes on under it.
  EXPECT_DOUBLE_EQ(calibrate::checked_memory_limit_gib(hw, "h200.yaml", m, 130, true), 130);
  EXPECT_NE(refusal(hw, m, 145, true).find("memory_limit_gib: 145.00 GiB is more than cuda:0"),
            std::string::npos);
  // No device visible: nothing to check against.
  MachineCapacity unknown = m;
  unknown.device_memory_gib = 0;
  EXPECT_DOUBLE_EQ(calibrate::checked_memory_limit_gib(hw, "h200.yaml", unknown, 150, false), 150);
}

TEST(MachineCheck, OffloadNeedsTheProfilesHostMemoryAndCores) {
  HardwareProfile hw = calibrate::load_hardware_profile(profile_path("h200"));
  const MachineCapacity m = h200_machine();  // 125 GiB, 16 cores; the profile says 224 GiB
  EXPECT_NO_THROW(calibrate::check_offload_host(hw, "h200.yaml", m, /*offload=*/false));
  try {
    calibrate::check_offload_host(hw, "h200.yaml", m, true);
    ADD_FAILURE() << "a profile with more host memory than the host was accepted";
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()),
              "hardware: h200.yaml: host_memory_gib: 224.00 GiB is more than this host has "
              "(125.00 GiB), and the experiment's trials offload to it; correct the profile");
  }
  hw.host_memory_gib = 120, hw.host_cores = 32;
  EXPECT_THROW(calibrate::check_offload_host(hw, "h200.yaml", m, true), UserError);
  hw.host_cores = 16;
  EXPECT_NO_THROW(calibrate::check_offload_host(hw, "h200.yaml", m, true));
  // No GPU visible (a dry run on another machine): the host is not the trials' host.
  hw.host_memory_gib = 224;
  MachineCapacity elsewhere = m;
  elsewhere.device_memory_gib = 0;
  EXPECT_NO_THROW(calibrate::check_offload_host(hw, "h200.yaml", elsewhere, true));
}

// What CUDA reports on those devices (total less the driver's reserve): H200 139.80 GiB
// (nvidia-smi 143,771 MiB); H100 80GB HBM3 79.1 GiB (nvidia-smi 81,559 MiB, an estimate). A
// profile above it makes every trial of a sweep without a limit refuse to start.
TEST(MachineCheck, ShippedGpuProfilesHoldWhatCudaReports) {
  EXPECT_DOUBLE_EQ(calibrate::load_hardware_profile(profile_path("h200")).device_memory_gib, 139.8);
  for (const char* name : {"h100-sxm", "dgx-h100-8", "dgx-h100-8x4", "dgx-h100-8x8",
                           "dgx-h100-8x16"}) {
    EXPECT_DOUBLE_EQ(calibrate::load_hardware_profile(profile_path(name)).device_memory_gib, 79.1)
        << name;
  }
}

// One point at two lengths, no memory_limit_gib: the default limit is the profile's.
constexpr const char* kNoLimit = R"(name: nolimit
hardware: cpu-local
world_size: 2
headroom: 0.1
base:
  model: {hidden_size: 32, num_layers: 1, num_heads: 4, num_kv_heads: 2, intermediate_size: 64,
          vocab_size: 128}
  train: {device: cpu, steps: 5}
space:
  memory.tiled_loss: [8]
  sequence.length: [1024, 2048]
objective: throughput
search: {method: grid}
budget: {trial_timeout_s: 30}
trial: {warmup_steps: 1, steps: 2}
)";

TEST_F(SweepCliTest, AProfileThatOverstatesTheDeviceIsRefusedBeforeAnyTrial) {
  std::ofstream(experiment_) << kNoLimit;
  const Result r = tune(sweep_args(), "ULYSSES_DEVICE_MEMORY_GIB=4");
  EXPECT_EQ(r.status, 2) << r.out << r.err;
  EXPECT_EQ(r.err, "error: hardware: " + profile_path("cpu-local") +
                       ": device.memory_gib: 10.00 GiB is more than the host has (4.00 GiB, "
                       "ULYSSES_DEVICE_MEMORY_GIB); correct the profile or set memory_limit_gib "
                       "<= 4.00 GiB in the experiment\n");
  EXPECT_FALSE(fs::exists(db_)) << "the database was written";
  EXPECT_FALSE(fs::exists(dir_ / "runs")) << "a run directory was written";
}

TEST_F(SweepCliTest, AProfileWithinTheDeviceRuns) {
  std::ofstream(experiment_) << kNoLimit;
  const Result r = tune(sweep_args(), "ULYSSES_DEVICE_MEMORY_GIB=64");
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  const std::vector<store::TrialRecord> rows = trials("nolimit-grid");
  ASSERT_EQ(rows.size(), 2u);
  for (const store::TrialRecord& t : rows) {
    EXPECT_EQ(t.status, "ok") << t.error;
    ASSERT_TRUE(t.limit_bytes.has_value());
    EXPECT_NEAR(static_cast<double>(*t.limit_bytes), 10 * 0.9 * (1 << 30), 1 << 20);  // profile's
  }
}

TEST_F(SweepCliTest, AnExplicitLimitTheDeviceHasRunsUnderAnOverstatingProfile) {
  // kExperiment sets memory_limit_gib 1.0; the "device" has 2 GiB, the profile says 10.
  const Result r = tune(sweep_args("--search grid --max-trials 2"), "ULYSSES_DEVICE_MEMORY_GIB=2");
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_EQ(trials("fake-grid").size(), 2u);
  const Result over = tune(sweep_args("--search grid --name over"), "ULYSSES_DEVICE_MEMORY_GIB=0.5");
  EXPECT_EQ(over.status, 2);
  EXPECT_NE(over.err.find("memory_limit_gib: 1.00 GiB is more than the host has (0.50 GiB"),
            std::string::npos)
      << over.err;
}

}  // namespace
}  // namespace ulysses::sweep
