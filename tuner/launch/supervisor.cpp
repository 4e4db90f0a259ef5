// Process-group supervision of local ranks: fork/exec, signal forwarding, fail-fast stop.
//
// The loop waits for SIGCHLD/SIGINT/SIGTERM with sigtimedwait while they are blocked, so no signal
// is lost between "check children" and "wait"; the short timeout also covers coalesced SIGCHLDs.
#include "tuner/launch/supervisor.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <system_error>

#include <c10/util/Exception.h>

#include "common/error.h"

namespace ulysses::launch {
namespace {

using Clock = std::chrono::steady_clock;

constexpr double kMaxWaitSeconds = 0.2;  // upper bound of one sigtimedwait

// argv/envp as the NULL-terminated arrays execve wants, built before fork (no allocation after).
struct PreparedSpec {
  std::vector<std::string> storage;
  std::vector<char*> argv;
  std::vector<char*> envp;

  explicit PreparedSpec(const ProcessSpec& spec) {
    storage.reserve(spec.argv.size() + spec.env.size());
    for (const auto& arg : spec.argv) storage.push_back(arg);
    for (const auto& var : spec.env) storage.push_back(var);
    for (size_t i = 0; i < spec.argv.size(); ++i) argv.push_back(storage[i].data());
    argv.push_back(nullptr);
    for (size_t i = spec.argv.size(); i < storage.size(); ++i) envp.push_back(storage[i].data());
    envp.push_back(nullptr);
  }
};

struct Child {
  pid_t pid = -1;
  bool running = false;
};

// Blocks SIGINT, SIGTERM and SIGCHLD in the calling thread for its lifetime.
class SignalBlock {
 public:
  SignalBlock() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGINT);
    sigaddset(&set_, SIGTERM);
    sigaddset(&set_, SIGCHLD);
    pthread_sigmask(SIG_BLOCK, &set_, &previous_);
  }
  ~SignalBlock() { pthread_sigmask(SIG_SETMASK, &previous_, nullptr); }
  SignalBlock(const SignalBlock&) = delete;
  SignalBlock& operator=(const SignalBlock&) = delete;

  const sigset_t& set() const { return set_; }
  const sigset_t& previous() const { return previous_; }

 private:
  sigset_t set_;
  sigset_t previous_;
};

// In the child: only async-signal-safe calls until execve.
[[noreturn]] void exec_child(const PreparedSpec& spec, const sigset_t& mask, pid_t parent) {
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(127);  // the supervisor died before prctl took effect
  pthread_sigmask(SIG_SETMASK, &mask, nullptr);
  execve(spec.argv[0], spec.argv.data(), spec.envp.data());
  const char* prefix = "launch: cannot execute ";
  [[maybe_unused]] ssize_t ignored = write(STDERR_FILENO, prefix, strlen(prefix));
  ignored = write(STDERR_FILENO, spec.argv[0], strlen(spec.argv[0]));
  const char* reason = strerror(errno);
  ignored = write(STDERR_FILENO, ": ", 2);
  ignored = write(STDERR_FILENO, reason, strlen(reason));
  ignored = write(STDERR_FILENO, "\n", 1);
  _exit(127);
}

// Sends sig to the child's process group (falls back to the child alone).
void signal_child(const Child& child, int sig) {
  if (!child.running) return;
  if (kill(-child.pid, sig) != 0) kill(child.pid, sig);
}

ProcessExit decode_status(int index, pid_t pid, int wait_status) {
  ProcessExit exit;
  exit.index = index;
  exit.pid = pid;
  if (WIFSIGNALED(wait_status)) {
    exit.signal = WTERMSIG(wait_status);
    exit.status = 128 + exit.signal;
  } else {
    exit.status = WEXITSTATUS(wait_status);
  }
  return exit;
}

// The state of one supervise() call.
// Invariants: children_[i] is running until reaped; stopping_ becomes true once (first failure or
// interrupt) and then result_.outcome no longer changes; kill_deadline_ is set only while
// stopping_ and the SIGKILL round has not been sent.
class Supervision {
 public:
  Supervision(const SupervisorOptions& options, const SignalBlock& signals)
      : options_(options), signals_(signals) {}

  // Starts all specs; on a fork failure kills and reaps what was started, then throws.
  void start(const std::vector<ProcessSpec>& specs) {
    std::vector<PreparedSpec> prepared;
    prepared.reserve(specs.size());
    for (const auto& spec : specs) prepared.emplace_back(spec);
    const pid_t self = getpid();
    for (const auto& spec : prepared) {
      const pid_t pid = fork();
      if (pid == 0) exec_child(spec, signals_.previous(), self);
      if (pid < 0) {
        const int error = errno;
        for (auto& child : children_) signal_child(child, SIGKILL);
        reap_blocking();
        throw std::system_error(error, std::generic_category(), "launch: fork");
      }
      setpgid(pid, pid);  // also done by the child; whichever runs first wins the race
      children_.push_back({pid, true});
    }
  }

  SupervisionResult wait_all() {
    while (reap_finished() > 0) {
      const Clock::time_point now = Clock::now();
      if (kill_deadline_ && now >= *kill_deadline_) {
        for (auto& child : children_) signal_child(child, SIGKILL);
        kill_deadline_.reset();
      }
      double wait_s = kMaxWaitSeconds;
      if (kill_deadline_) {
        wait_s = std::min(wait_s, std::chrono::duration<double>(*kill_deadline_ - now).count());
      }
      wait_s = std::max(wait_s, 0.0);
      timespec timeout;
      timeout.tv_sec = static_cast<time_t>(wait_s);
      timeout.tv_nsec = static_cast<long>((wait_s - std::floor(wait_s)) * 1e9);
      siginfo_t info;
      const int sig = sigtimedwait(&signals_.set(), &info, &timeout);
      if (sig == SIGINT || sig == SIGTERM) on_interrupt(sig);
    }
    return result_;
  }

 private:
  // Reaps every finished child; returns how many are still running.
  int reap_finished() {
    int running = 0;
    for (size_t i = 0; i < children_.size(); ++i) {
      Child& child = children_[i];
      if (!child.running) continue;
      int wait_status = 0;
      const pid_t done = waitpid(child.pid, &wait_status, WNOHANG);
      if (done == child.pid || (done < 0 && errno == ECHILD)) {
        child.running = false;
        if (done == child.pid) on_exit(decode_status(static_cast<int>(i), child.pid, wait_status));
      } else {
        ++running;
      }
    }
    return running;
  }

  void reap_blocking() {
    for (auto& child : children_) {
      if (!child.running) continue;
      int wait_status = 0;
      while (waitpid(child.pid, &wait_status, 0) < 0 && errno == EINTR) {
      }
      child.running = false;
    }
  }

  void on_exit(const ProcessExit& exit) {
    if (stopping_ || exit.status == 0) return;
    result_.outcome = Outcome::kFailed;
    result_.exit_status = exit.status;
    result_.first_failure = exit;
    begin_stopping(SIGTERM);
  }

  void on_interrupt(int sig) {
    if (stopping_) {  // a second interrupt, or one during a stop: no more grace
      for (auto& child : children_) signal_child(child, SIGKILL);
      kill_deadline_.reset();
      return;
    }
    result_.outcome = Outcome::kInterrupted;
    result_.exit_status = kExitInterrupted;
    result_.interrupt_signal = sig;
    begin_stopping(sig);
  }

  void begin_stopping(int sig) {
    stopping_ = true;
    for (auto& child : children_) {
      if (!child.running) continue;
      ++result_.stopped;
      signal_child(child, sig);
    }
    kill_deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(options_.grace_s));
  }

  const SupervisorOptions& options_;
  const SignalBlock& signals_;
  std::vector<Child> children_;
  SupervisionResult result_;
  bool stopping_ = false;
  std::optional<Clock::time_point> kill_deadline_;  // SIGKILL the rest at this time
};

}  // namespace

SupervisionResult supervise(const std::vector<ProcessSpec>& specs,
                            const SupervisorOptions& options) {
  TORCH_CHECK(!specs.empty(), "supervise: no processes to start");
  for (const auto& spec : specs) TORCH_CHECK(!spec.argv.empty(), "supervise: empty argv");
  SignalBlock signals;
  Supervision supervision(options, signals);
  supervision.start(specs);
  return supervision.wait_all();
}

std::string describe_exit(const ProcessExit& exit) {
  if (exit.signal == 0) return "exited with status " + std::to_string(exit.status);
  const char* name = strsignal(exit.signal);
  return "was killed by signal " + std::to_string(exit.signal) + " (" +
         (name ? name : "unknown") + "); status " + std::to_string(exit.status);
}

}  // namespace ulysses::launch
