// Tests of `ulysses-tune launch`: launch plans (in-process), the supervisor (in-process, on real
// child processes), and the ulysses-tune binary end to end with a fake trainer script that
// records its environment and pid, and with the real ulysses-train on two "nodes".
//
// No test depends on timing: waits poll for files or exits under generous deadlines (a deadline
// only turns a hang into a failure), far below the fake trainer's 300 s sleep.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <thread>

#include "support/processes.h"
#include "support/test_files.h"
#include "common/error.h"
#include "common/paths.h"
#include "config/run_config.h"
#include "tuner/launch/free_port.h"
#include "tuner/launch/launch_plan.h"
#include "tuner/launch/signal_block.h"
#include "tuner/launch/supervisor.h"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace ulysses::launch {
namespace {

constexpr double kExitDeadlineS = 120.0;  // well below the fake trainer's 300 s sleep
constexpr double kFileDeadlineS = 60.0;

// ---------------------------------------------------------------------------------------------
// Helpers

using testing::read_text;
using testing::write_executable;

// A TempDir named after this suite.
class TempDir : public testing::TempDir {
 public:
  TempDir() : testing::TempDir("launch-test") {}
};

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::stringstream stream(text);
  for (std::string line; std::getline(stream, line);) lines.push_back(line);
  return lines;
}

using testing::process_alive;
using testing::wait_until;

// Starts argv with stdout/stderr redirected to files and `extra_env` added to our environment.
pid_t spawn_process(const std::vector<std::string>& argv, const std::vector<std::string>& extra_env,
                    const fs::path& out_path, const fs::path& err_path) {
  std::vector<std::string> env = current_environment();
  env.insert(env.end(), extra_env.begin(), extra_env.end());
  std::vector<char*> argv_ptrs, env_ptrs;
  for (const auto& arg : argv) argv_ptrs.push_back(const_cast<char*>(arg.c_str()));
  argv_ptrs.push_back(nullptr);
  for (const auto& var : env) env_ptrs.push_back(const_cast<char*>(var.c_str()));
  env_ptrs.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, out_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = -1;
  const int rc =
      posix_spawn(&pid, argv_ptrs[0], &actions, nullptr, argv_ptrs.data(), env_ptrs.data());
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) throw std::runtime_error("posix_spawn " + argv[0] + ": " + strerror(rc));
  return pid;
}

// Exit code, or 128 + signal; -1 (and a test failure) when the deadline passes.
int wait_exit(pid_t pid, double deadline_s) {
  int status = 0;
  const bool exited = wait_until([&] { return waitpid(pid, &status, WNOHANG) == pid; }, deadline_s);
  if (!exited) {
    ADD_FAILURE() << "process " << pid << " still running after " << deadline_s << " s";
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return -1;
  }
  return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
}

// Cleanup after a failed expectation, so that a broken launcher does not leak sleeping ranks.
void kill_leftovers(const std::vector<pid_t>& pids) {
  for (pid_t pid : pids) {
    if (process_alive(pid)) kill(pid, SIGKILL);
  }
}

// key -> value of a file of "KEY=VALUE" lines (as `env` prints).
std::map<std::string, std::string> read_env_file(const fs::path& path) {
  std::map<std::string, std::string> values;
  for (const auto& line : split_lines(read_text(path))) {
    const size_t eq = line.find('=');
    if (eq != std::string::npos) values[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return values;
}

// A fake trainer: records env, argv and pid in $FAKE_DIR, prints one line, then by $FAKE_MODE:
//   ok: exit 0;  sleep: sleep 300;  fail: rank 2 waits for every rank's pid file, exits 3, the
//   others sleep 300;  killself: like fail, but rank 2 kills itself with SIGKILL.
constexpr const char* kFakeTrainer = R"SH(#!/bin/sh
env > "$FAKE_DIR/env.$RANK"
echo "$*" > "$FAKE_DIR/args.$RANK"
echo $$ > "$FAKE_DIR/pid.$RANK.tmp" && mv "$FAKE_DIR/pid.$RANK.tmp" "$FAKE_DIR/pid.$RANK"
echo "fake-trainer rank $RANK of $WORLD_SIZE"
echo "library noise from rank $RANK" >&2
if [ "$FAKE_MODE" = ok ]; then exit 0; fi
if [ "$RANK" = 2 ] && [ "$FAKE_MODE" != sleep ]; then
  i=0
  while [ $i -lt 1200 ] && [ "$(ls "$FAKE_DIR" | grep -c '^pid\.[0-9]*$')" -lt "$LOCAL_WORLD_SIZE" ]; do
    sleep 0.05; i=$((i + 1))
  done
  if [ "$FAKE_MODE" = killself ]; then kill -KILL $$; fi
  echo "error: rank 2 broke" >&2
  exit 3
fi
exec sleep 300
)SH";

// A 2 x 2 mesh with defaults otherwise: valid for world size 4 only.
constexpr const char* kMeshConfig = "mesh: {sp: 2, dp: 2}\ntrain: {steps: 0}\n";

struct CliResult {
  int status = -1;
  std::string out;
  std::string err;
};

class LaunchCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    launcher_ = sibling_binary("ulysses-tune");
    ASSERT_TRUE(fs::exists(launcher_)) << "ulysses-tune not built: " << launcher_;
    fake_dir_ = temp_.path() / "fake";
    fs::create_directories(fake_dir_);
    trainer_ = (temp_.path() / "fake-trainer.sh").string();
    write_executable(trainer_, kFakeTrainer);
    config_ = (temp_.path() / "run.yaml").string();
    std::ofstream(config_) << kMeshConfig << "output: {dir: " << (temp_.path() / "out").string()
                           << "}\n";
  }

  pid_t start(const std::vector<std::string>& args, const std::string& mode) {
    std::vector<std::string> argv{launcher_, "launch"};
    argv.insert(argv.end(), args.begin(), args.end());
    return spawn_process(argv, {"FAKE_DIR=" + fake_dir_.string(), "FAKE_MODE=" + mode},
                         temp_.path() / "out.txt", temp_.path() / "err.txt");
  }

  CliResult finish(pid_t pid) {
    CliResult result;
    result.status = wait_exit(pid, kExitDeadlineS);
    result.out = read_text(temp_.path() / "out.txt");
    result.err = read_text(temp_.path() / "err.txt");
    return result;
  }

  CliResult run(const std::vector<std::string>& args, const std::string& mode = "ok") {
    return finish(start(args, mode));
  }

  std::vector<std::string> fake_args(int nproc) const {
    return {config_, "--nproc", std::to_string(nproc), "--trainer", trainer_};
  }

  fs::path pid_file(int rank) const { return fake_dir_ / ("pid." + std::to_string(rank)); }

  std::vector<pid_t> wait_for_pids(const std::vector<int>& ranks) {
    std::vector<pid_t> pids;
    for (int rank : ranks) {
      if (!wait_until([&] { return fs::exists(pid_file(rank)); }, kFileDeadlineS)) {
        ADD_FAILURE() << "rank " << rank << " never wrote its pid";
        continue;
      }
      pids.push_back(std::stoi(read_text(pid_file(rank))));
    }
    return pids;
  }

  bool any_rank_started() const { return !fs::is_empty(fake_dir_); }

  TempDir temp_;
  std::string launcher_, trainer_, config_;
  fs::path fake_dir_;
};

// One line on stderr, "error: ...", containing `needle`.
void expect_one_error_line(const CliResult& result, const std::string& needle) {
  EXPECT_EQ(result.status, kExitUsage) << result.err;
  const auto lines = split_lines(result.err);
  ASSERT_EQ(lines.size(), 1u) << result.err;
  EXPECT_EQ(lines[0].rfind("error: ", 0), 0u) << lines[0];
  EXPECT_NE(lines[0].find(needle), std::string::npos) << lines[0];
}

// ---------------------------------------------------------------------------------------------
// Launch plans

TEST(LaunchPlan, RankVariablesFollowTorchrun) {
  LaunchOptions options;
  options.config_path = "run.yaml";
  options.nproc = 2;
  options.nnodes = 3;
  options.node_rank = 1;
  options.master_addr = "10.0.0.1";
  const auto variables = rank_variables(options, 1, 4321, {"OMP_NUM_THREADS=4"});
  const std::vector<std::pair<std::string, std::string>> expected{
      {"RANK", "3"},         {"WORLD_SIZE", "6"},          {"LOCAL_RANK", "1"},
      {"LOCAL_WORLD_SIZE", "2"}, {"GROUP_RANK", "1"},     {"MASTER_ADDR", "10.0.0.1"},
      {"MASTER_PORT", "4321"}};
  EXPECT_EQ(variables, expected);
  // Without OMP_NUM_THREADS in the environment, multi-rank launches pin it to 1 like torchrun.
  const auto without_omp = rank_variables(options, 0, 4321, {});
  EXPECT_EQ(without_omp.back(), (std::pair<std::string, std::string>{"OMP_NUM_THREADS", "1"}));
}

TEST(LaunchPlan, MergeEnvironmentReplacesAndAppends) {
  const auto merged = merge_environment({"A=1", "RANK=9", "B=2"}, {{"RANK", "0"}, {"C", "x=y"}});
  EXPECT_EQ(merged, (std::vector<std::string>{"A=1", "RANK=0", "B=2", "C=x=y"}));
}

TEST(LaunchPlan, TrainerArgumentsRepeatSet) {
  LaunchOptions options;
  options.config_path = "r.yaml";
  options.overrides = {"a.b=1", "c=x y"};
  EXPECT_EQ(trainer_arguments(options),
            (std::vector<std::string>{"--config", "r.yaml", "--set", "a.b=1", "--set", "c=x y"}));
}

TEST(LaunchPlan, CheckRejectsInconsistentOptions) {
  LaunchOptions good;
  good.config_path = "r.yaml";
  good.nproc = 2;
  EXPECT_NO_THROW(check_launch_options(good));
  auto expect_error = [](LaunchOptions options, const std::string& key) {
    try {
      check_launch_options(options);
      ADD_FAILURE() << "no error for " << key;
    } catch (const UserError& e) {
      EXPECT_EQ(std::string(e.what()).rfind(key + ":", 0), 0u) << e.what();
    }
  };
  LaunchOptions two_nodes = good;
  two_nodes.nnodes = 2;
  expect_error(two_nodes, "--master-port");  // no port for a multi-node job
  two_nodes.master_port = 1234;
  EXPECT_NO_THROW(check_launch_options(two_nodes));
  two_nodes.node_rank = 2;
  expect_error(two_nodes, "--node-rank");
  LaunchOptions bad_set = good;
  bad_set.overrides = {"train.steps"};
  expect_error(bad_set, "--set");
  LaunchOptions bad_nproc = good;
  bad_nproc.nproc = 0;
  expect_error(bad_nproc, "--nproc");
}

TEST(LaunchPlan, ClusterCommandLines) {
  LaunchOptions options;
  options.config_path = "my run.yaml";
  options.overrides = {"train.steps=5"};
  options.nproc = 8;
  options.nnodes = 2;
  options.master_addr = "node0";
  options.master_port = 29400;
  options.print = "torchrun";
  EXPECT_EQ(cluster_command_lines(options, "/opt/bin/ulysses-train"),
            (std::vector<std::string>{
                "# node 0",
                "torchrun --nnodes 2 --nproc-per-node 8 --node-rank 0 --master-addr node0 "
                "--master-port 29400 --no-python /opt/bin/ulysses-train --config 'my run.yaml' "
                "--set train.steps=5",
                "# node 1",
                "torchrun --nnodes 2 --nproc-per-node 8 --node-rank 1 --master-addr node0 "
                "--master-port 29400 --no-python /opt/bin/ulysses-train --config 'my run.yaml' "
                "--set train.steps=5"}));
  options.node_rank = 1;  // an explicit node rank prints only that node's line
  EXPECT_EQ(cluster_command_lines(options, "ulysses-train").size(), 2u);
  LaunchOptions one_node = options;
  one_node.nnodes = 1;
  one_node.node_rank = -1;
  one_node.print = "torchrun";
  EXPECT_EQ(cluster_command_lines(one_node, "t"),  // the port given: the nodes form, one node
            (std::vector<std::string>{
                "torchrun --nnodes 1 --nproc-per-node 8 --node-rank 0 --master-addr node0 "
                "--master-port 29400 --no-python t --config 'my run.yaml' --set train.steps=5"}));
  one_node.master_port = 0;
  EXPECT_EQ(cluster_command_lines(one_node, "t"),
            (std::vector<std::string>{"torchrun --standalone --nproc-per-node 8 --no-python t "
                                      "--config 'my run.yaml' --set train.steps=5"}));
  options.print = "srun";
  EXPECT_EQ(cluster_command_lines(options, "ulysses-train"),
            (std::vector<std::string>{
                "MASTER_ADDR=node0 MASTER_PORT=29400 srun --nodes 2 --ntasks-per-node 8 "
                "--kill-on-bad-exit=1 ulysses-train --config 'my run.yaml' --set train.steps=5"}));
  // Neither given: the ranks find node 0 and a port in SLURM's variables, not 127.0.0.1.
  LaunchOptions in_allocation = options;
  in_allocation.master_addr = kLocalMasterAddr;
  in_allocation.master_port = 0;
  EXPECT_EQ(cluster_command_lines(in_allocation, "ulysses-train"),
            (std::vector<std::string>{
                "srun --nodes 2 --ntasks-per-node 8 --kill-on-bad-exit=1 ulysses-train "
                "--config 'my run.yaml' --set train.steps=5"}));
}

// The README's multi-node example: tiny-cpu.yaml's 2 x 2 mesh on 2 nodes x 8 ranks. Launch says
// exactly what to set, and what it says makes the config valid.
TEST(LaunchPlan, MeshNotFittingTheWorldSaysWhatToSet) {
  const std::string tiny = (fs::path(project_home()) / "experiments/runs/tiny-cpu.yaml").string();
  LaunchOptions options;
  options.config_path = tiny;
  options.nproc = 8;
  options.nnodes = 2;
  config::RunConfig config = config::load_run_config(tiny, {});
  try {
    validate_for_launch(config, options);
    ADD_FAILURE() << "a 2 x 2 mesh passed for 16 ranks";
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()),
              "mesh: dp*sp = 4 does not match the world size 16 (--nnodes 2 x --nproc 8); add "
              "--set mesh.dp=8 (keeps mesh.sp=2)");
  }
  config::RunConfig fixed = config::load_run_config(tiny, {"mesh.dp=8"});
  EXPECT_NO_THROW(validate_for_launch(fixed, options));
  // 3 ranks: sp 2 cannot stay and sp 3 does not divide the 8 heads.
  options.nproc = 3;
  options.nnodes = 1;
  EXPECT_EQ(mesh_fix(config, 3), "--set mesh.dp=3 --set mesh.sp=1");
  EXPECT_EQ(mesh_fix(config, 4), "");  // fits already
  try {
    validate_for_launch(config, options);
    ADD_FAILURE() << "a 2 x 2 mesh passed for 3 ranks";
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()),
              "mesh: dp*sp = 4 does not match the world size 3 (--nproc 3); add --set mesh.dp=3 "
              "--set mesh.sp=1");
  }
}

TEST(LaunchPlan, ShellQuote) {
  EXPECT_EQ(shell_quote("a/b-c.yaml"), "a/b-c.yaml");
  EXPECT_EQ(shell_quote(""), "''");
  EXPECT_EQ(shell_quote("it's $x"), "'it'\\''s $x'");
}

TEST(LaunchPlan, FreePortIsBindable) {
  const int port = pick_free_port();
  EXPECT_GE(port, 1);
  EXPECT_LE(port, 65535);
}

// ---------------------------------------------------------------------------------------------
// Supervisor (in-process)

ProcessSpec shell(const std::string& script) {
  return ProcessSpec{{"/bin/sh", "-c", script}, current_environment()};
}

TEST(Supervisor, AllSucceed) {
  const auto result = supervise({shell("exit 0"), shell("true"), shell("exit 0")}, {});
  EXPECT_EQ(result.outcome, Outcome::kAllSucceeded);
  EXPECT_EQ(result.exit_status, 0);
  EXPECT_FALSE(result.first_failure.has_value());
}

TEST(Supervisor, FailureStopsOthersAndTheirChildren) {
  TempDir temp;
  const std::string dir = temp.path().string();
  // Process 0 starts a grandchild in its process group and waits on it.
  const std::string waiter = "sleep 300 & echo $! > " + dir + "/grandchild; echo $$ > " + dir +
                             "/waiter.tmp; mv " + dir + "/waiter.tmp " + dir + "/waiter; wait";
  const std::string failer = "while [ ! -f " + dir + "/waiter ]; do sleep 0.05; done; exit 7";
  const auto result = supervise({shell(waiter), shell(failer)}, {});
  EXPECT_EQ(result.outcome, Outcome::kFailed);
  EXPECT_EQ(result.exit_status, 7);
  ASSERT_TRUE(result.first_failure.has_value());
  EXPECT_EQ(result.first_failure->index, 1);
  EXPECT_EQ(result.first_failure->signal, 0);
  EXPECT_EQ(result.stopped, 1);
  const pid_t waiter_pid = std::stoi(read_text(temp.path() / "waiter"));
  const pid_t grandchild = std::stoi(read_text(temp.path() / "grandchild"));
  EXPECT_FALSE(process_alive(waiter_pid));
  EXPECT_TRUE(wait_until([&] { return !process_alive(grandchild); }, kFileDeadlineS))
      << "grandchild " << grandchild << " survived";
  kill_leftovers({waiter_pid, grandchild});
}

TEST(Supervisor, IgnoredSigtermEscalatesToSigkill) {
  TempDir temp;
  const std::string dir = temp.path().string();
  const std::string stubborn = "trap '' TERM; echo $$ > " + dir + "/s.tmp; mv " + dir +
                               "/s.tmp " + dir + "/s; exec sleep 300";
  const std::string failer = "while [ ! -f " + dir + "/s ]; do sleep 0.05; done; exit 5";
  SupervisorOptions options;
  options.grace_s = 0.2;
  const auto result = supervise({shell(stubborn), shell(failer)}, options);
  EXPECT_EQ(result.exit_status, 5);
  const pid_t stubborn_pid = std::stoi(read_text(temp.path() / "s"));
  EXPECT_FALSE(process_alive(stubborn_pid));
  kill_leftovers({stubborn_pid});
}

// A caller that has SIGINT / SIGTERM / SIGCHLD blocked (a sweep blocks them in every slot thread)
// still starts its children with them unblocked, so that the SIGTERM that stops a child on a
// failure or a timeout is delivered, not held until the SIGKILL after the grace period. The
// children are programs run directly (a shell resets its mask and would hide it).
TEST(Supervisor, ChildrenStartWithTheStopSignalsUnblocked) {
  TempDir temp;
  sigset_t stop, previous;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGCHLD);
  ASSERT_EQ(pthread_sigmask(SIG_BLOCK, &stop, &previous), 0);
  ProcessSpec mask({"/bin/grep", "^SigBlk:", "/proc/self/status"}, current_environment());
  mask.stdout_path = (temp.path() / "mask").string();
  const auto printed = supervise({mask}, {});
  // A sleeper stopped when the other process fails: by our SIGTERM, not by the SIGKILL after it.
  SupervisorOptions options;
  options.grace_s = 30;
  const auto stopped = supervise(
      {ProcessSpec({"/bin/sleep", "300"}, current_environment()), shell("sleep 0.2; exit 5")},
      options);
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);

  EXPECT_EQ(printed.exit_status, 0);
  const std::string line = read_text(temp.path() / "mask");
  ASSERT_NE(line.find(':'), std::string::npos) << line;
  const unsigned long long bits = std::stoull(line.substr(line.find(':') + 1), nullptr, 16);
  for (int sig : {SIGINT, SIGTERM, SIGCHLD}) {
    EXPECT_EQ(bits & (1ull << (sig - 1)), 0u) << "signal " << sig << " blocked: " << line;
  }
  EXPECT_EQ(stopped.exit_status, 5);
  ASSERT_EQ(stopped.exits.size(), 2u);
  EXPECT_EQ(stopped.exits[0].signal, SIGTERM) << "the sleeper was not stopped by the SIGTERM";
}

TEST(Supervisor, SignalDeathAndExecFailure) {
  const auto killed = supervise({shell("kill -KILL $$")}, {});
  ASSERT_TRUE(killed.first_failure.has_value());
  EXPECT_EQ(killed.exit_status, 128 + SIGKILL);
  EXPECT_EQ(killed.first_failure->signal, SIGKILL);
  EXPECT_NE(describe_exit(*killed.first_failure).find("signal 9"), std::string::npos);

  const auto missing = supervise({ProcessSpec{{"/nonexistent/trainer"}, {}}}, {});
  EXPECT_EQ(missing.outcome, Outcome::kFailed);
  EXPECT_EQ(missing.exit_status, 127);
}

// ---------------------------------------------------------------------------------------------
// ulysses-tune launch, end to end with the fake trainer

TEST_F(LaunchCliTest, FailingRankStopsTheOthersAndSetsTheStatus) {
  const pid_t launcher = start(fake_args(4), "fail");
  const std::vector<pid_t> pids = wait_for_pids({0, 1, 2, 3});
  const CliResult result = finish(launcher);  // well before the others' 300 s sleep ends
  EXPECT_EQ(result.status, 3) << result.err;
  EXPECT_NE(result.err.find("launch: rank 2 (local rank 2"), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("exited with status 3"), std::string::npos) << result.err;
  // The failing rank's error once; every rank's stderr (and the noise) only in the logs.
  const size_t why = result.err.find("error: rank 2 broke\nlaunch: rank 2");
  ASSERT_NE(why, std::string::npos) << result.err;
  EXPECT_EQ(result.err.find("error: rank 2 broke", why + 1), std::string::npos) << result.err;
  EXPECT_EQ(result.err.find("library noise"), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("every rank's stderr: " + (temp_.path() / "out/logs").string()),
            std::string::npos)
      << result.err;
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_NE(read_text(temp_.path() / "out/logs" / ("rank-" + std::to_string(rank) + ".err"))
                  .find("library noise from rank " + std::to_string(rank)),
              std::string::npos);
  }
  for (pid_t pid : pids) EXPECT_FALSE(process_alive(pid)) << "rank pid " << pid << " left";
  kill_leftovers(pids);
}

TEST_F(LaunchCliTest, RankKilledBySignalGives128PlusSignal) {
  const pid_t launcher = start(fake_args(4), "killself");
  const std::vector<pid_t> pids = wait_for_pids({0, 1, 3});
  const CliResult result = finish(launcher);
  EXPECT_EQ(result.status, 128 + SIGKILL) << result.err;
  EXPECT_NE(result.err.find("rank 2"), std::string::npos) << result.err;
  for (pid_t pid : pids) EXPECT_FALSE(process_alive(pid)) << "rank pid " << pid << " left";
  kill_leftovers(pids);
}

TEST_F(LaunchCliTest, EveryRankGetsItsEnvironmentAndArguments) {
  const CliResult result = run({config_, "--nproc", "4", "--trainer", trainer_, "--set",
                                "train.steps=0", "--set", "optim.lr=0.01"});
  ASSERT_EQ(result.status, 0) << result.err;
  std::string port;
  for (int rank = 0; rank < 4; ++rank) {
    auto env = read_env_file(fake_dir_ / ("env." + std::to_string(rank)));
    EXPECT_EQ(env["RANK"], std::to_string(rank));
    EXPECT_EQ(env["WORLD_SIZE"], "4");
    EXPECT_EQ(env["LOCAL_RANK"], std::to_string(rank));
    EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "4");
    EXPECT_EQ(env["GROUP_RANK"], "0");
    EXPECT_EQ(env["MASTER_ADDR"], "127.0.0.1");
    if (rank == 0) port = env["MASTER_PORT"];
    EXPECT_EQ(env["MASTER_PORT"], port);  // one port for all ranks
    EXPECT_EQ(read_text(fake_dir_ / ("args." + std::to_string(rank))),
              "--config " + config_ + " --set train.steps=0 --set optim.lr=0.01\n");
    // The ranks' stdout passes through the launcher's stdout.
    EXPECT_NE(result.out.find("fake-trainer rank " + std::to_string(rank) + " of 4"),
              std::string::npos);
  }
  ASSERT_FALSE(port.empty());
  EXPECT_GE(std::stoi(port), 1);
  EXPECT_LE(std::stoi(port), 65535);
}

TEST_F(LaunchCliTest, SecondNodeGetsGlobalRanks) {
  const CliResult result = run({config_, "--nproc", "2", "--trainer", trainer_, "--nnodes", "2",
                                "--node-rank", "1", "--master-addr", "127.0.0.1",
                                "--master-port", "23456"});
  ASSERT_EQ(result.status, 0) << result.err;
  for (int local = 0; local < 2; ++local) {
    auto env = read_env_file(fake_dir_ / ("env." + std::to_string(2 + local)));
    EXPECT_EQ(env["RANK"], std::to_string(2 + local));
    EXPECT_EQ(env["LOCAL_RANK"], std::to_string(local));
    EXPECT_EQ(env["WORLD_SIZE"], "4");
    EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "2");
    EXPECT_EQ(env["GROUP_RANK"], "1");
    EXPECT_EQ(env["MASTER_PORT"], "23456");
  }
  EXPECT_FALSE(fs::exists(fake_dir_ / "env.0"));
}

TEST_F(LaunchCliTest, SigtermToLaunchStopsAllRanks) {
  const pid_t launcher = start(fake_args(4), "sleep");
  const std::vector<pid_t> pids = wait_for_pids({0, 1, 2, 3});
  ASSERT_EQ(kill(launcher, SIGTERM), 0);
  const CliResult result = finish(launcher);
  EXPECT_EQ(result.status, kExitInterrupted) << result.err;
  EXPECT_NE(result.err.find("launch: interrupted by signal 15"), std::string::npos) << result.err;
  for (pid_t pid : pids) EXPECT_FALSE(process_alive(pid)) << "rank pid " << pid << " left";
  kill_leftovers(pids);
}

TEST_F(LaunchCliTest, KilledLauncherLeavesNoRanks) {
  const pid_t launcher = start(fake_args(4), "sleep");
  const std::vector<pid_t> pids = wait_for_pids({0, 1, 2, 3});
  ASSERT_EQ(kill(launcher, SIGKILL), 0);
  EXPECT_EQ(finish(launcher).status, 128 + SIGKILL);
  // The ranks die from PR_SET_PDEATHSIG, asynchronously: wait for that (deadline = a hang).
  const bool all_gone = wait_until(
      [&] { return std::none_of(pids.begin(), pids.end(), process_alive); }, kFileDeadlineS);
  EXPECT_TRUE(all_gone) << "ranks outlived the killed launcher";
  kill_leftovers(pids);
}

TEST_F(LaunchCliTest, PrintTorchrunAndSrun) {
  const CliResult torchrun = run({config_, "--nproc", "4", "--set", "train.steps=0", "--trainer",
                                  "/opt/ulysses/bin/ulysses-train", "--print", "torchrun"});
  ASSERT_EQ(torchrun.status, 0) << torchrun.err;
  EXPECT_EQ(torchrun.out,  // one node, no --master-port: torchrun picks the port itself
            "torchrun --standalone --nproc-per-node 4 --no-python /opt/ulysses/bin/ulysses-train "
            "--config " + config_ + " --set train.steps=0\n");
  const CliResult srun = run({config_, "--nproc", "2", "--nnodes", "2", "--master-addr", "n0",
                              "--master-port", "6000", "--trainer", "ulysses-train", "--print",
                              "srun"});
  ASSERT_EQ(srun.status, 0) << srun.err;
  EXPECT_EQ(srun.out,
            "MASTER_ADDR=n0 MASTER_PORT=6000 srun --nodes 2 --ntasks-per-node 2 "
            "--kill-on-bad-exit=1 ulysses-train --config " + config_ + "\n");
  EXPECT_FALSE(any_rank_started());
}

TEST_F(LaunchCliTest, MissingConfigFailsBeforeAnyRank) {
  const std::string missing = (temp_.path() / "no-such-run.yaml").string();
  expect_one_error_line(run({missing, "--nproc", "4", "--trainer", trainer_}), "no-such-run.yaml");
  EXPECT_FALSE(any_rank_started());
}

TEST_F(LaunchCliTest, MeshNotMatchingNprocFailsBeforeAnyRank) {
  expect_one_error_line(run(fake_args(3)), "mesh");  // 2 x 2 mesh, world of 3
  EXPECT_FALSE(any_rank_started());
  expect_one_error_line(run({config_, "--nproc", "4", "--trainer", trainer_, "--set",
                             "mesh.sp=4"}),
                        "mesh");  // 2 x 4 mesh, world of 4
  EXPECT_FALSE(any_rank_started());
}

TEST_F(LaunchCliTest, BadOptionsExit2) {
  expect_one_error_line(run({config_, "--nproc", "2", "--nnodes", "2", "--trainer", trainer_}),
                        "--master-port");
  expect_one_error_line(run({config_, "--nproc", "4", "--trainer", "/nonexistent/trainer"}),
                        "--trainer");
  const CliResult no_nproc = run({config_});  // CLI11's own message
  EXPECT_EQ(no_nproc.status, kExitUsage);
  EXPECT_NE(no_nproc.err.find("--nproc"), std::string::npos) << no_nproc.err;
  EXPECT_FALSE(any_rank_started());
}

TEST_F(LaunchCliTest, HelpIsUseful) {
  const pid_t top = spawn_process({launcher_, "--help"}, {}, temp_.path() / "out.txt",
                                  temp_.path() / "err.txt");
  const CliResult top_help = finish(top);
  EXPECT_EQ(top_help.status, 0);
  EXPECT_NE(top_help.out.find("launch"), std::string::npos) << top_help.out;
  const CliResult help = run({"--help"});
  EXPECT_EQ(help.status, 0);
  for (const char* option : {"RUN.yaml", "--nproc", "--set", "--nnodes", "--node-rank",
                             "--master-addr", "--master-port", "--trainer", "--print"}) {
    EXPECT_NE(help.out.find(option), std::string::npos) << option << " missing in\n" << help.out;
  }
}

// ---------------------------------------------------------------------------------------------
// Two "nodes" of the real trainer

TEST(LaunchTwoNodes, RealTrainerRanksZeroToThree) {
  const std::string launcher = sibling_binary("ulysses-tune");
  const std::string trainer = sibling_binary("ulysses-train");
  const fs::path config = fs::path(project_home()) / "experiments/runs/tiny-cpu.yaml";
  if (!fs::exists(trainer)) GTEST_SKIP() << "ulysses-train not built yet";
  if (!fs::exists(config)) GTEST_SKIP() << config << " not written yet";
  TempDir temp;
  const std::string port = std::to_string(pick_free_port());
  std::vector<pid_t> nodes;
  for (int node = 0; node < 2; ++node) {
    nodes.push_back(spawn_process(
        {launcher, "launch", config.string(), "--nproc", "2", "--nnodes", "2", "--node-rank",
         std::to_string(node), "--master-addr", "127.0.0.1", "--master-port", port, "--trainer",
         trainer, "--set", "train.steps=0", "--set",
         "output.dir=" + (temp.path() / "run").string()},
        {}, temp.path() / ("out." + std::to_string(node)),
        temp.path() / ("err." + std::to_string(node))));
  }
  // Expected groups for dp 2 x sp 2: SP groups are contiguous ranks, DP groups strided.
  const std::vector<std::string> expected{
      "ulysses-train: rank 0 of 4 (dp 2 x sp 2), sp group [0, 1], dp group [0, 2]",
      "ulysses-train: rank 1 of 4 (dp 2 x sp 2), sp group [0, 1], dp group [1, 3]",
      "ulysses-train: rank 2 of 4 (dp 2 x sp 2), sp group [2, 3], dp group [0, 2]",
      "ulysses-train: rank 3 of 4 (dp 2 x sp 2), sp group [2, 3], dp group [1, 3]"};
  for (int node = 0; node < 2; ++node) {
    const int status = wait_exit(nodes[node], kExitDeadlineS);
    const std::string out = read_text(temp.path() / ("out." + std::to_string(node)));
    const std::string err = read_text(temp.path() / ("err." + std::to_string(node)));
    EXPECT_EQ(status, 0) << "node " << node << "\n" << out << err;
    for (int local = 0; local < 2; ++local) {
      const std::string& line = expected[node * 2 + local];
      EXPECT_NE(out.find(line + "\n"), std::string::npos) << "node " << node << " lacks: " << line
                                                         << "\n" << out;
    }
  }
}

// The README's example on tiny-cpu.yaml (a 2 x 2 mesh) for 2 nodes x 8 ranks: one line saying
// what to set; with that set, the lines print.
TEST(LaunchPrint, MultiNodeMeshMismatchSaysWhatToSet) {
  const std::string launcher = sibling_binary("ulysses-tune");
  const std::string tiny = (fs::path(project_home()) / "experiments/runs/tiny-cpu.yaml").string();
  TempDir temp;
  const std::vector<std::string> args{launcher, "launch", tiny, "--nproc", "8", "--nnodes", "2",
                                      "--print", "torchrun"};
  const pid_t bad = spawn_process(args, {}, temp.path() / "bad.out", temp.path() / "bad.err");
  EXPECT_EQ(wait_exit(bad, kExitDeadlineS), kExitUsage);
  EXPECT_EQ(read_text(temp.path() / "bad.err"),
            "error: mesh: dp*sp = 4 does not match the world size 16 (--nnodes 2 x --nproc 8); "
            "add --set mesh.dp=8 (keeps mesh.sp=2)\n");
  std::vector<std::string> fixed = args;
  fixed.insert(fixed.end(), {"--set", "mesh.dp=8"});
  // Node 1 cannot reach 127.0.0.1 of node 0: the address must be given.
  const pid_t no_addr = spawn_process(fixed, {}, temp.path() / "addr.out", temp.path() / "addr.err");
  EXPECT_EQ(wait_exit(no_addr, kExitDeadlineS), kExitUsage);
  EXPECT_EQ(read_text(temp.path() / "addr.err").rfind("error: --master-addr: give node 0's address", 0),
            0u)
      << read_text(temp.path() / "addr.err");
  fixed.insert(fixed.end(), {"--master-addr", "10.0.0.1"});
  const pid_t good = spawn_process(fixed, {}, temp.path() / "good.out", temp.path() / "good.err");
  EXPECT_EQ(wait_exit(good, kExitDeadlineS), 0) << read_text(temp.path() / "good.err");
  EXPECT_EQ(split_lines(read_text(temp.path() / "good.out")).size(), 4u);  // 2 x (# node, line)
}

// The printed single-node torchrun line, run as printed (torchrun found on PATH, from the venv of
// $ULYSSES_PYTHON), trains: no fixed port, and no rank serving the agent's store a second time.
TEST(LaunchPrint, PrintedTorchrunLineRuns) {
  const std::string launcher = sibling_binary("ulysses-tune");
  if (!fs::exists(sibling_binary("ulysses-train"))) GTEST_SKIP() << "ulysses-train not built";
  const char* python = std::getenv("ULYSSES_PYTHON");
  if (python == nullptr || *python == '\0') GTEST_SKIP() << "ULYSSES_PYTHON not set";
  const fs::path venv_bin = fs::path(python).parent_path();
  ASSERT_TRUE(fs::exists(venv_bin / "torchrun")) << venv_bin;
  TempDir temp;
  const fs::path config = fs::path(project_home()) / "experiments/runs/tiny-cpu.yaml";
  const pid_t print = spawn_process(
      {launcher, "launch", config.string(), "--nproc", "2", "--set", "mesh.dp=1", "--set",
       "sequence.length=64", "--set", "train.steps=2", "--set",
       "output.dir=" + (temp.path() / "run").string(), "--print", "torchrun"},
      {}, temp.path() / "print.out", temp.path() / "print.err");
  ASSERT_EQ(wait_exit(print, kExitDeadlineS), 0) << read_text(temp.path() / "print.err");
  const auto lines = split_lines(read_text(temp.path() / "print.out"));
  ASSERT_EQ(lines.size(), 1u) << read_text(temp.path() / "print.out");
  const pid_t job = spawn_process(
      {"/bin/sh", "-c", "PATH=" + shell_quote(venv_bin.string()) + ":\"$PATH\"; export PATH; " +
                            lines[0]},
      {}, temp.path() / "job.out", temp.path() / "job.err");
  const int status = wait_exit(job, 240.0);
  const std::string out = read_text(temp.path() / "job.out");
  const std::string err = read_text(temp.path() / "job.err");
  EXPECT_EQ(status, 0) << lines[0] << "\n" << out << err;
  EXPECT_NE(out.find("step 2/2"), std::string::npos) << out << err;
  EXPECT_TRUE(fs::exists(temp.path() / "run" / "summary.json"));
  EXPECT_EQ(err.find("failed to bind"), std::string::npos) << err;
}

// A stop that came while the signals were blocked is taken by release() (this process goes on)
// and the mask is put back as it was; without release() the same signal would end the process.
TEST(SignalBlock, ReleaseTakesAStopThatCameWhileBlockedAndRestoresTheMask) {
  sigset_t before;
  pthread_sigmask(SIG_SETMASK, nullptr, &before);
  ASSERT_FALSE(sigismember(&before, SIGTERM));
  {
    SignalBlock block;
    raise(SIGCHLD);
    raise(SIGTERM);  // to this thread, which blocks it: pending
    EXPECT_EQ(block.release(), SIGTERM);
    EXPECT_EQ(block.release(), 0);  // once only
  }
  sigset_t after;
  pthread_sigmask(SIG_SETMASK, nullptr, &after);
  EXPECT_FALSE(sigismember(&after, SIGTERM));
  EXPECT_FALSE(sigismember(&after, SIGINT));
  {
    SignalBlock block;
    EXPECT_EQ(block.release(), 0);  // nothing came
  }
  SignalBlock not_blocking(false);
  pthread_sigmask(SIG_SETMASK, nullptr, &after);
  EXPECT_FALSE(sigismember(&after, SIGINT));
  EXPECT_EQ(not_blocking.release(), 0);
}

}  // namespace
}  // namespace ulysses::launch
