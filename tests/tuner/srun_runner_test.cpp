// runner: srun without SLURM (tuner/trial/srun_runner.h, tuner/launch/sbatch.h): the job step's
// command line and environment, srun's reports of how tasks ended (texts as SLURM 22.05 prints
// them, taken from real runs) mapped to the statuses local trials get, sbatch scripts, and the
// experiment's runner / nodes keys. The real-SLURM run is slurm_sweep_test.sh.
#include <c10/util/Exception.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <fstream>

#include "common/error.h"
#include "support/test_files.h"
#include "tuner/experiment/experiment.h"
#include "tuner/launch/sbatch.h"
#include "tuner/trial/slots.h"
#include "tuner/trial/srun_runner.h"

namespace ulysses::trial {
namespace {

using launch::Outcome;
using launch::SupervisionResult;

SupervisionResult srun_exited(int status) {
  SupervisionResult r;
  r.outcome = status == 0 ? Outcome::kAllSucceeded : Outcome::kFailed;
  r.exit_status = status;
  launch::ProcessExit exit;
  exit.index = 0;
  exit.pid = 4242;
  exit.status = status;
  if (status != 0) r.first_failure = exit;
  r.exits = {exit};
  return r;
}

TEST(SrunStep, CommandLineHasTheTrialsShapeLimitAndLogs) {
  SrunStep step;
  step.srun = "/usr/bin/srun";
  step.nnodes = 2;
  step.ntasks = 8;
  step.timeout_s = 61;
  step.job_name = "ulysses-trial-7";
  step.run_dir = "/runs/7";
  step.command = {"/bin/ulysses-train", "--config", "/runs/7/run.yaml"};
  const std::vector<std::string> expected{
      "/usr/bin/srun", "--nodes", "2", "--ntasks", "8", "--ntasks-per-node", "4",
      "--kill-on-bad-exit=1", "--quit-on-interrupt", "--time", "2",
      "--job-name", "ulysses-trial-7", "--output", "/runs/7/rank-%t.out",
      "--error", "/runs/7/rank-%t.err", "/bin/ulysses-train", "--config", "/runs/7/run.yaml"};
  EXPECT_EQ(srun_step_argv(step), expected);
  step.timeout_s = 0;  // no timeout: no --time
  for (const std::string& word : srun_step_argv(step)) EXPECT_NE(word, "--time");
  EXPECT_EQ(step_time_limit_min(60), 1);
  EXPECT_EQ(step_time_limit_min(60.5), 2);
  EXPECT_EQ(step_time_limit_min(0), 0);
}

// A slot's step runs on its nodes, and may start while an earlier step there is cleaned up.
TEST(SrunStep, ASlotsStepNamesItsNodes) {
  SrunStep step;
  step.srun = "srun";
  step.nnodes = 2;
  step.ntasks = 2;
  step.run_dir = "/r";
  step.command = {"/bin/t"};
  step.nodelist = {"n3", "n4"};
  const std::vector<std::string> argv = srun_step_argv(step);
  const std::vector<std::string> head(argv.begin(), argv.begin() + 12);
  const std::vector<std::string> expected{"srun", "--nodes", "2", "--ntasks", "2",
                                          "--ntasks-per-node", "1", "--kill-on-bad-exit=1",
                                          "--quit-on-interrupt", "--nodelist", "n3,n4",
                                          "--overlap"};
  EXPECT_EQ(head, expected);
  step.nodelist = {"n3"};  // not the step's node count: a bug
  EXPECT_THROW(srun_step_argv(step), c10::Error);
}

// Node failures as SLURM 22.05 reports them, and our backstop; other failures are not.
TEST(SrunClassify, NodeFailuresAreTold) {
  EXPECT_EQ(node_failure_line("srun: error: Node failure on n3\nsrun: error: n3: task 1: Killed\n",
                              false, 0),
            "srun: error: Node failure on n3");
  EXPECT_EQ(node_failure_line("slurmstepd: error: *** STEP 9.3 ON n3 CANCELLED AT "
                              "2026-11-28T10:00:00 DUE TO NODE FAILURE ***\n",
                              false, 0),
            "slurmstepd: error: *** STEP 9.3 ON n3 CANCELLED AT 2026-11-28T10:00:00 DUE TO NODE "
            "FAILURE ***");
  EXPECT_EQ(node_failure_line("srun: error: Task launch for StepId=9.4 failed on node n4: "
                              "Communication connection failure\n",
                              false, 0),
            "srun: error: Task launch for StepId=9.4 failed on node n4: Communication connection "
            "failure");
  EXPECT_NE(node_failure_line("", true, 135).find("srun did not end 135 s"), std::string::npos);
  EXPECT_EQ(node_failure_line("srun: error: n1: task 0: Exited with exit code 12\n", false, 0),
            "");
  EXPECT_EQ(node_failure_line("slurmstepd: error: *** STEP 9.5 ON n1 CANCELLED AT "
                              "2026-11-28T10:00:00 DUE TO TIME LIMIT ***\n",
                              false, 0),
            "");
}

// Slots of an allocation, a GPU node and a CPU: disjoint, labelled, and refused in one line
// naming `slots` when one cannot hold a trial.
TEST(TrialSlots, SplitsNodesDevicesAndCores) {
  SlotResources have;
  have.nodes = parse_hostnames("n1\nn2\n  n3\nn4\n\n");
  ASSERT_EQ(have.nodes, (std::vector<std::string>{"n1", "n2", "n3", "n4"}));
  have.cores = {0, 1, 2, 3, 4, 5, 6, 7, 8};
  have.cuda_devices = {"0", "1", "2", "3", "4", "5", "6", "7"};

  SlotNeeds srun{"srun", "cuda", 8, 2};
  EXPECT_EQ(resolve_slot_count(0, srun, have), 2);
  std::vector<Slot> slots = split_slots(2, srun, have);
  ASSERT_EQ(slots.size(), 2u);
  EXPECT_EQ(slots[0].nodes, (std::vector<std::string>{"n1", "n2"}));
  EXPECT_EQ(slots[1].label, "nodes n3,n4");
  EXPECT_TRUE(slots[1].cores.empty());
  try {
    split_slots(3, srun, have);
    ADD_FAILURE() << "3 slots of 2 nodes in 4 accepted";
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()), "slots: 3 slots of 2 nodes (nodes) need 6 nodes; the "
                                     "allocation has 4 nodes");
  }

  SlotNeeds gpu{"local", "cuda", 2, 1};
  EXPECT_EQ(resolve_slot_count(0, gpu, have), 4);
  slots = split_slots(4, gpu, have);
  ASSERT_EQ(slots.size(), 4u);
  EXPECT_EQ(slots[1].cuda_devices, "2,3");
  EXPECT_EQ(slots[1].label, "cuda 2,3");
  EXPECT_EQ(slots[0].cores, (std::vector<int>{0, 1, 2}));  // 9 cores: 3, 2, 2, 2
  EXPECT_EQ(slots[3].cores, (std::vector<int>{7, 8}));
  EXPECT_EQ(slots[0].threads_per_rank, 1);
  EXPECT_THROW(split_slots(5, gpu, have), UserError);  // 10 devices needed

  SlotNeeds cpu{"local", "cpu", 1, 1};
  have.cores = {0, 1};
  EXPECT_EQ(resolve_slot_count(0, cpu, have), 1);
  slots = split_slots(2, cpu, have);
  ASSERT_EQ(slots.size(), 2u);
  EXPECT_EQ(slots[0].label, "cores 0-0");
  EXPECT_EQ(slots[1].cores, (std::vector<int>{1}));
  EXPECT_EQ(slots[1].threads_per_rank, 1);
  cpu.world_size = 2;
  try {
    split_slots(2, cpu, have);
    ADD_FAILURE() << "a 1-core slot for 2 ranks accepted";
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()), "slots: 2 slots of the 2 cores this sweep may use leave 1 "
                                     "core to some slot; a trial of 2 ranks needs one core per "
                                     "rank (2 cores)");
  }
  have.cores = {0, 2, 4, 5, 6, 7};
  cpu.world_size = 1;
  slots = split_slots(2, cpu, have);
  EXPECT_EQ(slots[0].label, "cores 0,2,4");
  EXPECT_EQ(slots[1].label, "cores 5-7");
  EXPECT_EQ(slots[1].threads_per_rank, 3);
  const std::vector<Slot> one = split_slots(1, cpu, have);  // today's: nothing set
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].label, "");
  EXPECT_TRUE(one[0].cores.empty());
  EXPECT_EQ(one[0].threads_per_rank, 0);
}

TEST(SrunStep, EnvironmentLetsTheRanksReadSlurm) {
  const std::vector<std::string> env = srun_environment(
      {"PATH=/bin", "RANK=3", "WORLD_SIZE=4", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=2",
       "GROUP_RANK=0", "TORCHELASTIC_RUN_ID=x", "MASTER_PORT=1", "SLURM_JOB_ID=5"},
      "node07", 29555, 4);
  const std::vector<std::string> expected{"PATH=/bin", "MASTER_PORT=29555", "SLURM_JOB_ID=5",
                                          "MASTER_ADDR=node07", "OMP_NUM_THREADS=1"};
  EXPECT_EQ(env, expected);
  const std::vector<std::string> one = srun_environment({"OMP_NUM_THREADS=2"}, "a", 2, 4);
  EXPECT_EQ(one, (std::vector<std::string>{"OMP_NUM_THREADS=2", "MASTER_ADDR=a", "MASTER_PORT=2"}));
  EXPECT_EQ(first_host("SLURM_JOB_NODELIST", "node[07-10,12],x1"), "node07");
  EXPECT_EQ(first_host("SLURM_JOB_NODELIST", "localhost"), "localhost");
}

// srun's stderr when rank 1 ran out of memory, rank 2 then lost its peer (13) and
// --kill-on-bad-exit terminated the rest (SLURM 22.05, a real run with a shell as the task).
constexpr const char* kOomThenCommFailure =
    "srun: error: localhost: task 1: Exited with exit code 12\n"
    "srun: launch/slurm: _step_signal: Terminating StepId=2.0\n"
    "slurmstepd-localhost: error: *** STEP 2.0 ON localhost CANCELLED AT 2026-11-22T18:11:24 ***\n"
    "srun: error: localhost: task 0: Exited with exit code 143\n"
    "srun: error: localhost: task 2: Exited with exit code 13\n"
    "srun: error: localhost: task 3: Terminated\n"
    "srun: Force Terminated StepId=2.0\n";

TEST(SrunClassify, TaskExitsComeFromSrunsReport) {
  const auto exits = parse_srun_task_exits(kOomThenCommFailure, 4, false, 7);
  ASSERT_EQ(exits.size(), 4u);
  EXPECT_EQ(exits[0].signal, SIGTERM);
  EXPECT_TRUE(exits[0].signalled_by_us);
  EXPECT_EQ(exits[1].status, 12);
  EXPECT_EQ(exits[1].signal, 0);
  EXPECT_EQ(exits[2].status, 13);
  EXPECT_EQ(exits[3].status, 128 + SIGTERM);
  EXPECT_TRUE(exits[3].signalled_by_us);
  const auto ranges =
      parse_srun_task_exits("srun: error: n1: tasks 0-1,3: Exited with exit code 12\n", 4, false, 7);
  ASSERT_EQ(ranges.size(), 4u);
  EXPECT_EQ(ranges[0].status, 12);
  EXPECT_EQ(ranges[1].status, 12);
  EXPECT_EQ(ranges[2].status, 0);
  EXPECT_EQ(ranges[3].status, 12);
  EXPECT_TRUE(parse_srun_task_exits("srun: error: Unable to create step\n", 4, false, 7).empty());
}

TEST(SrunClassify, OutOfMemoryWinsOverThePeersCommFailureAsLocally) {
  // srun itself exits with the highest task code (143 here): the tasks decide, not srun.
  const Classification c =
      classify_step(srun_exited(143), kOomThenCommFailure, step_end(kOomThenCommFailure), false,
                    {"", "out of memory: DefaultCPUAllocator", "peer went away", ""}, 60, 4);
  EXPECT_EQ(c.status, "oom");
  EXPECT_EQ(c.rank, 1);
  EXPECT_EQ(c.exit_code, 12);
  EXPECT_EQ(c.error, "out of memory: DefaultCPUAllocator");
  const Classification comm = classify_step(
      srun_exited(13), "srun: error: h: tasks 0-3: Exited with exit code 13\n",
      StepEnd::kNormal, false, {"comm: timed out", "", "", ""}, 60, 4);
  EXPECT_EQ(comm.status, "failed");
  EXPECT_EQ(comm.exit_code, 13);
}

TEST(SrunClassify, StepTimeLimitIsATimeout) {
  // A real step killed by its --time (SLURM 22.05).
  const std::string stderr_text =
      "slurmstepd-localhost: error: *** STEP 3.0 ON localhost CANCELLED AT 2026-11-22T18:12:51 "
      "DUE TO TIME LIMIT ***\n"
      "srun: Job step aborted: Waiting up to 7 seconds for job step to finish.\n"
      "srun: error: localhost: tasks 0-1: Terminated\n"
      "srun: launch/slurm: _step_signal: Terminating StepId=3.0\n";
  ASSERT_EQ(step_end(stderr_text), StepEnd::kTimeLimit);
  const Classification c = classify_step(srun_exited(143), stderr_text, StepEnd::kTimeLimit,
                                         false, {"step 3 of 5", ""}, 50, 2);
  EXPECT_EQ(c.status, "timeout");
  EXPECT_EQ(c.exit_code, 124);
  EXPECT_EQ(c.error, "step time limit of 1 min reached (SLURM); step 3 of 5");
}

TEST(SrunClassify, CancelledStepLeavesTheTrialToResume) {
  const std::string stderr_text =
      "slurmstepd-localhost: error: *** JOB 5 ON localhost CANCELLED AT 2026-11-22T18:33:37 ***\n"
      "srun: error: localhost: tasks 0-3: Terminated\n";
  ASSERT_EQ(step_end(stderr_text), StepEnd::kCancelled);
  const Classification c =
      classify_step(srun_exited(143), stderr_text, StepEnd::kCancelled, false, {}, 60, 4);
  EXPECT_EQ(c.status, "running");
  // A task that died from a signal nobody sent is killed, as locally.
  const Classification killed = classify_step(
      srun_exited(137), "srun: error: h: task 2: Killed\n", StepEnd::kNormal, false, {}, 60, 4);
  EXPECT_EQ(killed.status, "killed");
  EXPECT_EQ(killed.rank, 2);
}

// A rank killed by a signal nobody in the sweep sent (the kernel's OOM killer, a crash): srun
// reports it, kill-on-bad-exit then terminates the step, and slurmstepd prints CANCELLED as it
// does for a scancel (the order of kOomThenCommFailure, a real run). The trial is killed, not
// left to --resume: only tasks reported after the step began terminating were stopped by SLURM.
TEST(SrunClassify, ATaskKilledBeforeTheStepIsTerminatedIsKilledNotCancelled) {
  const std::string stderr_text =
      "srun: error: localhost: task 1: Killed\n"
      "srun: launch/slurm: _step_signal: Terminating StepId=4.0\n"
      "slurmstepd-localhost: error: *** STEP 4.0 ON localhost CANCELLED AT 2026-11-22T19:01:02 ***\n"
      "srun: error: localhost: tasks 0,2-3: Terminated\n";
  ASSERT_EQ(step_end(stderr_text), StepEnd::kCancelled);
  const auto exits = parse_srun_task_exits(stderr_text, 4, true, 7);
  ASSERT_EQ(exits.size(), 4u);
  EXPECT_FALSE(exits[1].signalled_by_us);
  EXPECT_TRUE(exits[0].signalled_by_us);
  EXPECT_TRUE(exits[3].signalled_by_us);
  const Classification c =
      classify_step(srun_exited(137), stderr_text, StepEnd::kCancelled, false, {}, 60, 4);
  EXPECT_EQ(c.status, "killed");
  EXPECT_EQ(c.rank, 1);
}

TEST(SrunClassify, SrunFailingWithoutTasksUsesItsOwnStatus) {
  const Classification c = classify_step(
      srun_exited(1), "srun: error: Unable to create step for job 9: Invalid generic resource\n",
      StepEnd::kNormal, false, {}, 60, 4);
  EXPECT_EQ(c.status, "failed");
  EXPECT_EQ(c.exit_code, 1);
  EXPECT_EQ(c.error, "srun: error: Unable to create step for job 9: Invalid generic resource");
  const Classification ok = classify_step(srun_exited(0), "", StepEnd::kNormal, true, {}, 60, 4);
  EXPECT_EQ(ok.status, "ok");
}

TEST(Sbatch, ScriptAndJobId) {
  launch::SbatchJob job;
  job.job_name = "ulysses-sweep-q";
  job.nodes = 2;
  job.ntasks_per_node = 4;
  job.time_limit_min = 16;
  job.output = "/runs/sweep-%j.log";
  job.comments = {"a sweep"};
  job.body = {"cd /work", "exec ulysses-tune sweep q.yaml"};
  EXPECT_EQ(launch::sbatch_script(job),
            "#!/usr/bin/env bash\n# a sweep\n#SBATCH --job-name=ulysses-sweep-q\n"
            "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=4\n#SBATCH --time=16\n"
            "#SBATCH --output=/runs/sweep-%j.log\nset -euo pipefail\ncd /work\n"
            "exec ulysses-tune sweep q.yaml\n");
  job.gpus_per_node = 4;  // a CUDA sweep asks for one GPU per rank
  EXPECT_NE(launch::sbatch_script(job).find("#SBATCH --ntasks-per-node=4\n#SBATCH --gpus-per-node=4\n"),
            std::string::npos);
  job.no_kill = true;  // a sweep on several node slots outlives a failed node
  EXPECT_NE(launch::sbatch_script(job).find("#SBATCH --output=/runs/sweep-%j.log\n#SBATCH --no-kill\n"),
            std::string::npos);
  EXPECT_EQ(launch::parse_sbatch_job_id("Submitted batch job 123\n"), "123");
  EXPECT_EQ(launch::parse_sbatch_job_id("77;cluster\n"), "77");
  EXPECT_FALSE(launch::parse_sbatch_job_id("sbatch: error: invalid partition").has_value());
}

// The experiment's runner and nodes keys (experiment.h).
class RunnerKeys : public ::testing::Test {
 protected:
  experiment::Experiment parse(const std::string& extra) {
    const std::string text =
        "name: r\nhardware: " + hardware_ + "\nworld_size: 8\n"
        "space: {mesh.sp: [1], sequence.length: [64]}\n" + extra;
    return experiment::parse_experiment(text, "r.yaml", experiment::default_profiles_dir());
  }
  std::string hardware_ = "cpu-local";
};

TEST_F(RunnerKeys, RunnerAndNodes) {
  EXPECT_EQ(parse("").runner, "local");
  EXPECT_EQ(parse("").nodes, 1);
  EXPECT_EQ(parse("runner: srun\n").nodes, 1);  // cpu-local has one node
  EXPECT_EQ(parse("runner: srun\nnodes: 2\n").nodes, 2);
  try {
    parse("runner: ssh\n");
    ADD_FAILURE() << "runner: ssh accepted";
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()), "r.yaml: runner: expected local or srun, got 'ssh'");
  }
  EXPECT_THROW(parse("nodes: 2\n"), UserError);                // local runs on one node
  EXPECT_THROW(parse("runner: srun\nnodes: 3\n"), UserError);  // 8 ranks over 3 nodes
  hardware_ = "dgx-h100-8x4";                                  // launcher srun, 4 nodes of 8
  EXPECT_EQ(parse("").runner, "srun");
  EXPECT_EQ(parse("").nodes, 1);
}

TEST_F(RunnerKeys, SlotsAndIsolation) {
  EXPECT_EQ(parse("").slots, 1);
  EXPECT_EQ(parse("").isolation, "offload_alone");
  EXPECT_EQ(parse("slots: 3\n").slots, 3);
  EXPECT_EQ(parse("slots: auto\n").slots, 0);
  EXPECT_EQ(parse("isolation: all_alone\n").isolation, "all_alone");
  for (const char* bad : {"slots: 0\n", "slots: two\n", "slots: 2.5\n"}) {
    try {
      parse(bad);
      ADD_FAILURE() << bad << " accepted";
    } catch (const UserError& e) {
      const std::string what = e.what();
      EXPECT_EQ(what.rfind("r.yaml: slots: expected a whole number >= 1 or auto", 0), 0u) << what;
    }
  }
  try {
    parse("isolation: none\n");
    ADD_FAILURE() << "isolation: none accepted";
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()),
              "r.yaml: isolation: expected offload_alone, shared or all_alone, got 'none'");
  }
}

}  // namespace
}  // namespace ulysses::trial
