// ulysses-train under the real torchrun of the venv's PyTorch (found beside $ULYSSES_PYTHON): the
// plain, --standalone and --rdzv-backend c10d forms train on 2 ranks (torchrun's agent serves the
// store: the ranks join it, none tries to serve it too); and one rank of a world of 2 started
// alone fails with exit 13 after comm.timeout_s, saying whom it waited for.
// No test depends on timing: deadlines only turn a hang into a failure.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/paths.h"
#include "support/processes.h"
#include "support/test_files.h"

extern char** environ;

namespace fs = std::filesystem;

namespace ulysses::comm {
namespace {

constexpr double kDeadlineS = 240.0;  // far above a 2-step tiny run; only a hang reaches it

struct ProcessRun {
  int status = -1;  // exit code, 128 + signal, or -1 when the deadline passed
  std::string out;
  std::string err;
};

// Runs argv with `extra_env` added to ours, stdout/stderr into files under `dir`.
ProcessRun run_process(const std::vector<std::string>& argv, const std::vector<std::string>& extra_env,
                const fs::path& dir) {
  std::vector<std::string> env;
  for (char** entry = environ; *entry != nullptr; ++entry) env.emplace_back(*entry);
  env.insert(env.end(), extra_env.begin(), extra_env.end());
  std::vector<char*> argv_ptrs, env_ptrs;
  for (const auto& arg : argv) argv_ptrs.push_back(const_cast<char*>(arg.c_str()));
  argv_ptrs.push_back(nullptr);
  for (const auto& var : env) env_ptrs.push_back(const_cast<char*>(var.c_str()));
  env_ptrs.push_back(nullptr);
  const fs::path out = dir / "stdout.txt", err = dir / "stderr.txt";
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, out.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawnattr_t attr;  // its own process group, so that a hung run can be killed whole
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, argv_ptrs[0], &actions, &attr, argv_ptrs.data(),
                             env_ptrs.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  ProcessRun run;
  if (rc != 0) {
    ADD_FAILURE() << "cannot start " << argv[0];
    return run;
  }
  int status = 0;
  if (testing::wait_until([&] { return waitpid(pid, &status, WNOHANG) == pid; }, kDeadlineS)) {
    run.status = WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
  } else {
    ADD_FAILURE() << argv[0] << " still running after " << kDeadlineS << " s";
    kill(-pid, SIGKILL);
    waitpid(pid, &status, 0);
  }
  run.out = testing::read_text(out);
  run.err = testing::read_text(err);
  return run;
}

// A TCP port that was free a moment ago.
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  ::close(fd);
  return ok ? ntohs(addr.sin_port) : -1;
}

// The trainer's arguments for a short 2-rank (dp 1 x sp 2) tiny run writing into `out_dir`.
std::vector<std::string> tiny_run_arguments(const fs::path& out_dir) {
  return {"--config", (fs::path(project_home()) / "experiments/runs/tiny-cpu.yaml").string(),
          "--set",    "mesh.dp=1",
          "--set",    "mesh.sp=2",
          "--set",    "sequence.length=64",
          "--set",    "train.steps=2",
          "--set",    "output.dir=" + out_dir.string()};
}

class TorchrunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    trainer_ = sibling_binary("ulysses-train");
    if (!fs::exists(trainer_)) GTEST_SKIP() << "ulysses-train not built";
    const char* python = std::getenv("ULYSSES_PYTHON");
    if (python == nullptr || *python == '\0') GTEST_SKIP() << "ULYSSES_PYTHON not set";
    torchrun_ = (fs::path(python).parent_path() / "torchrun").string();
    ASSERT_TRUE(fs::exists(torchrun_)) << torchrun_ << " missing beside $ULYSSES_PYTHON";
  }

  // Runs torchrun `form...` --nproc-per-node 2 --no-python ulysses-train <tiny run>; expects it
  // to train 2 steps.
  void expect_trains(const std::vector<std::string>& form) {
    testing::TempDir dir("torchrun-test");
    std::vector<std::string> argv{torchrun_};
    argv.insert(argv.end(), form.begin(), form.end());
    for (const char* word : {"--nproc-per-node", "2", "--no-python"}) argv.push_back(word);
    argv.push_back(trainer_);
    for (auto& arg : tiny_run_arguments(dir.path() / "run")) argv.push_back(arg);
    const ProcessRun run = run_process(argv, {}, dir.path());
    EXPECT_EQ(run.status, 0) << run.out << run.err;
    EXPECT_NE(run.out.find("step 2/2"), std::string::npos) << run.out << run.err;
    EXPECT_TRUE(fs::exists(dir.path() / "run" / "summary.json")) << run.out << run.err;
    // No rank tried to serve the store that torchrun's agent already serves.
    EXPECT_EQ(run.err.find("failed to bind"), std::string::npos) << run.err;
    EXPECT_EQ(run.err.find("Address already in use"), std::string::npos) << run.err;
  }

  std::string trainer_;
  std::string torchrun_;
};

TEST_F(TorchrunTest, PlainForm) { expect_trains({}); }

TEST_F(TorchrunTest, Standalone) { expect_trains({"--standalone"}); }

TEST_F(TorchrunTest, C10dRendezvous) {
  expect_trains({"--rdzv-backend", "c10d", "--rdzv-endpoint",
                 "127.0.0.1:" + std::to_string(free_port())});
}

// Rank 0 of 2 alone: exit 13 after comm.timeout_s (not a hidden minimum), with the waiting line.
TEST(TrainerRendezvous, MissingRankExits13NamingTheTimeout) {
  const std::string trainer = sibling_binary("ulysses-train");
  if (!fs::exists(trainer)) GTEST_SKIP() << "ulysses-train not built";
  testing::TempDir dir("missing-rank");
  const std::string port = std::to_string(free_port());
  std::vector<std::string> argv{trainer};
  for (auto& arg : tiny_run_arguments(dir.path() / "run")) argv.push_back(arg);
  argv.push_back("--set");
  argv.push_back("comm.timeout_s=2");
  const ProcessRun run = run_process(argv,
                              {"RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=2",
                               "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + port},
                              dir.path());
  EXPECT_EQ(run.status, kExitCommFailure) << run.out << run.err;
  EXPECT_NE(run.err.find("rendezvous: waiting for 1 of 2 ranks at 127.0.0.1:" + port + "\n"),
            std::string::npos)
      << run.err;
  EXPECT_NE(run.err.find("error: rendezvous at 127.0.0.1:" + port +
                         ": only 1 of 2 ranks arrived within comm.timeout_s = 2 s"),
            std::string::npos)
      << run.err;
}

}  // namespace
}  // namespace ulysses::comm
