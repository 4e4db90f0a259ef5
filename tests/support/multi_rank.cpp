// Re-exec based multi-process test harness (see multi_rank.h).
#include "support/multi_rank.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>
#include <vector>
#include "common/remove_tree.h"

extern char** environ;

namespace ulysses::testing {
namespace {

std::string current_test_filter() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return std::string(info->test_suite_name()) + "." + info->name();
}

std::string make_temp_dir() {
  std::string pattern =
      (std::filesystem::temp_directory_path() / "ulysses-test-XXXXXX").string();
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back('\0');
  if (mkdtemp(buf.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  return std::string(buf.data());
}

// Index of this run_ranks call within the current test, so that a child re-executing a test with
// several run_ranks calls runs only the call it was started for.
int next_call_index() {
  static std::string test_name;
  static int calls = 0;
  const std::string current = current_test_filter();
  if (current != test_name) {
    test_name = current;
    calls = 0;
  }
  return calls++;
}

// The file a child creates just before running the body; its absence after exit 0 means the
// child ran no test body (a filter matching nothing exits 0 in gtest).
std::string ran_marker(const std::string& temp_dir, int rank) {
  return temp_dir + "/ran-rank-" + std::to_string(rank);
}

}  // namespace

bool in_rank_child() { return std::getenv("ULYSSES_TEST_RANK") != nullptr; }

void run_ranks(int world, const std::function<void(const RankContext&)>& body, double timeout_s) {
  run_ranks_with_filter(current_test_filter(), world, body, timeout_s);
}

void run_ranks_with_filter(const std::string& gtest_filter, int world,
                           const std::function<void(const RankContext&)>& body, double timeout_s) {
  const int call_index = next_call_index();
  if (in_rank_child()) {
    if (call_index != std::atoi(std::getenv("ULYSSES_TEST_CALL"))) return;  // another call's ranks
    RankContext ctx;
    ctx.rank = std::atoi(std::getenv("ULYSSES_TEST_RANK"));
    ctx.world = std::atoi(std::getenv("ULYSSES_TEST_WORLD"));
    ctx.store_path = std::getenv("ULYSSES_TEST_STORE");
    ctx.temp_dir = std::getenv("ULYSSES_TEST_TMP");
    int status = 0;
    try {
      std::ofstream(ran_marker(ctx.temp_dir, ctx.rank)) << "ran\n";
      body(ctx);
      status = ::testing::Test::HasFailure() ? 1 : 0;
    } catch (const std::exception& e) {
      std::cerr << "[rank " << ctx.rank << "] exception: " << e.what() << std::endl;
      status = 1;
    }
    std::cout.flush();
    std::cerr.flush();
    _exit(status);
  }

  const std::string temp_dir = make_temp_dir();
  const std::string store = temp_dir + "/store";
  const std::string filter = "--gtest_filter=" + gtest_filter;
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> env_strings;
    for (char** e = environ; *e; ++e) env_strings.emplace_back(*e);
    env_strings.push_back("ULYSSES_TEST_RANK=" + std::to_string(r));
    env_strings.push_back("ULYSSES_TEST_WORLD=" + std::to_string(world));
    env_strings.push_back("ULYSSES_TEST_STORE=" + store);
    env_strings.push_back("ULYSSES_TEST_TMP=" + temp_dir);
    env_strings.push_back("ULYSSES_TEST_CALL=" + std::to_string(call_index));
    std::vector<char*> envp;
    for (auto& s : env_strings) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::string exe = "/proc/self/exe";
    std::string quiet = "--gtest_brief=1";
    std::vector<char*> argv = {exe.data(), const_cast<char*>(filter.c_str()), quiet.data(),
                               nullptr};
    pid_t pid = 0;
    int rc = posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), envp.data());
    ASSERT_EQ(rc, 0) << "posix_spawn failed for rank " << r;
    pids.push_back(pid);
  }

  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(int64_t(timeout_s * 1000));
  std::vector<int> exit_codes(world, -1);
  int remaining = world;
  bool killed = false;
  while (remaining > 0) {
    for (int r = 0; r < world; ++r) {
      if (exit_codes[r] != -1) continue;
      int status = 0;
      pid_t got = waitpid(pids[r], &status, WNOHANG);
      if (got == pids[r]) {
        exit_codes[r] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        --remaining;
        if (exit_codes[r] != 0 && !killed) {
          for (int o = 0; o < world; ++o)
            if (exit_codes[o] == -1) kill(pids[o], SIGKILL);
          killed = true;
        }
      }
    }
    if (remaining > 0 && std::chrono::steady_clock::now() > deadline && !killed) {
      ADD_FAILURE() << "ranks did not finish within " << timeout_s << " s; killing them";
      for (int o = 0; o < world; ++o)
        if (exit_codes[o] == -1) kill(pids[o], SIGKILL);
      killed = true;
    }
    if (remaining > 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::vector<bool> ran(world);
  for (int r = 0; r < world; ++r) ran[r] = std::filesystem::exists(ran_marker(temp_dir, r));
  std::error_code ec;
  ulysses::remove_tree(temp_dir);
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(exit_codes[r], 0) << "rank " << r << " failed";
    if (exit_codes[r] == 0) {
      EXPECT_TRUE(ran[r]) << "rank " << r << " exited 0 but ran no test body (--gtest_filter="
                          << gtest_filter << " matched no test, or the child never reached this "
                          << "run_ranks call)";
    }
  }
}

}  // namespace ulysses::testing
