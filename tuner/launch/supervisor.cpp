// Process-group supervision of local ranks: fork/exec, output redirection, signal forwarding,
// fail-fast stop, timeout.
//
// The loop waits for SIGCHLD/SIGINT/SIGTERM with sigtimedwait while they are blocked, so no signal
// is lost between "check children" and "wait"; the short timeout also covers coalesced SIGCHLDs.
#include "tuner/launch/supervisor.h"

#include <fcntl.h>
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
#include "tuner/launch/signal_block.h"

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

// The files the children's stdout/stderr go to, opened close-on-exec by the parent before any fork
// (so a path that cannot be written throws before anything starts); -1 = inherit. Closed on
// destruction: each child keeps the copies it dup2'ed onto its fds 1 and 2.
class OutputFiles {
 public:
  explicit OutputFiles(const std::vector<ProcessSpec>& specs) {
    try {
      for (const auto& spec : specs) {
        const int out = open_output(spec.stdout_path);
        stdout_.push_back(out);
        stderr_.push_back(spec.stderr_path == spec.stdout_path ? out
                                                                : open_output(spec.stderr_path));
      }
    } catch (...) {
      close_all();
      throw;
    }
  }
  ~OutputFiles() { close_all(); }
  OutputFiles(const OutputFiles&) = delete;
  OutputFiles& operator=(const OutputFiles&) = delete;

  int stdout_fd(size_t i) const { return stdout_[i]; }
  int stderr_fd(size_t i) const { return stderr_[i]; }

 private:
  int open_output(const std::string& path) {
    if (path.empty()) return -1;
    const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
      throw std::system_error(errno, std::generic_category(), "launch: cannot open " + path);
    }
    owned_.push_back(fd);
    return fd;
  }
  void close_all() {
    for (int fd : owned_) close(fd);
    owned_.clear();
  }

  std::vector<int> stdout_, stderr_;  // by spec index
  std::vector<int> owned_;            // every fd opened here, once
};

struct Child {
  pid_t pid = -1;
  bool running = false;
  unsigned signals_sent = 0;  // bit s set once signal s (< 32) was sent to the child's group
};

// In the child: makes `fd` (an OutputFiles descriptor, or -1 = keep) the child's `target` fd.
void redirect(int fd, int target) {
  if (fd < 0) return;
  if (fd == target) {
    fcntl(fd, F_SETFD, 0);  // dup2 onto itself would leave close-on-exec set
  } else if (dup2(fd, target) < 0) {
    _exit(127);
  }
}

// In the child: only async-signal-safe calls until execve.
[[noreturn]] void exec_child(const PreparedSpec& spec, int stdout_fd, int stderr_fd,
                             const sigset_t& mask, pid_t parent) {
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(127);  // the supervisor died before prctl took effect
  redirect(stdout_fd, STDOUT_FILENO);
  redirect(stderr_fd, STDERR_FILENO);
  // The caller's mask, less the signals the supervisor sends or waits for: a caller that had
  // them blocked already (a sweep's slot threads block them for the whole sweep) must not pass
  // that on through execve, or the child never sees the SIGTERM that asks it to stop.
  sigset_t child_mask = mask;
  sigdelset(&child_mask, SIGINT);
  sigdelset(&child_mask, SIGTERM);
  sigdelset(&child_mask, SIGCHLD);
  pthread_sigmask(SIG_SETMASK, &child_mask, nullptr);
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
void signal_child(Child& child, int sig) {
  if (!child.running) return;
  if (sig < 32) child.signals_sent |= 1u << sig;
  if (kill(-child.pid, sig) != 0) kill(child.pid, sig);
}

ProcessExit decode_status(int index, const Child& child, int wait_status) {
  ProcessExit exit;
  exit.index = index;
  exit.pid = child.pid;
  if (WIFSIGNALED(wait_status)) {
    exit.signal = WTERMSIG(wait_status);
    exit.status = 128 + exit.signal;
    exit.signalled_by_us = exit.signal < 32 && ((child.signals_sent >> exit.signal) & 1u) != 0;
  } else {
    exit.status = WEXITSTATUS(wait_status);
  }
  return exit;
}

// The state of one supervise() call.
// Invariants: children_[i] is running until reaped, and result_.exits[i] is set when it is reaped;
// stopping_ becomes true once (first failure, interrupt or timeout) and then result_.outcome no
// longer changes; kill_deadline_ is set only while stopping_ and the SIGKILL round has not been
// sent; timeout_deadline_ is Clock::time_point::max() iff options_.timeout_s == 0.
class Supervision {
 public:
  Supervision(const SupervisorOptions& options, const SignalBlock& signals)
      : options_(options), signals_(signals) {}

  // Starts all specs; on a fork failure kills and reaps what was started, then throws.
  void start(const std::vector<ProcessSpec>& specs) {
    std::vector<PreparedSpec> prepared;
    prepared.reserve(specs.size());
    for (const auto& spec : specs) prepared.emplace_back(spec);
    const OutputFiles files(specs);
    const pid_t self = getpid();
    for (size_t i = 0; i < prepared.size(); ++i) {
      const pid_t pid = fork();
      if (pid == 0) {
        exec_child(prepared[i], files.stdout_fd(i), files.stderr_fd(i), signals_.previous(), self);
      }
      if (pid < 0) {
        const int error = errno;
        for (auto& child : children_) signal_child(child, SIGKILL);
        reap_blocking();
        throw std::system_error(error, std::generic_category(), "launch: fork");
      }
      setpgid(pid, pid);  // also done by the child; whichever runs first wins the race
      children_.push_back({pid, true, 0});
    }
    result_.exits.resize(children_.size());
    if (options_.timeout_s > 0) timeout_deadline_ = Clock::now() + to_duration(options_.timeout_s);
  }

  SupervisionResult wait_all() {
    while (reap_finished() > 0) {
      const Clock::time_point now = Clock::now();
      if (!stopping_ && now >= timeout_deadline_) {
        // A failure already happened (its settle window ran into the timeout): it stays the
        // outcome, and the processes still waiting are stopped.
        if (result_.first_failure) {
          begin_stopping(SIGTERM);
        } else {
          on_timeout();
        }
      }
      if (!stopping_ && settle_deadline_ && now >= *settle_deadline_) begin_stopping(SIGTERM);
      if (kill_deadline_ && now >= *kill_deadline_) {
        for (auto& child : children_) signal_child(child, SIGKILL);
        kill_deadline_.reset();
      }
      double wait_s = kMaxWaitSeconds;
      if (kill_deadline_) wait_s = std::min(wait_s, seconds_until(*kill_deadline_, now));
      if (!stopping_) wait_s = std::min(wait_s, seconds_until(timeout_deadline_, now));
      if (!stopping_ && settle_deadline_) {
        wait_s = std::min(wait_s, seconds_until(*settle_deadline_, now));
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
        if (done == child.pid) {
          result_.exits[i] = decode_status(static_cast<int>(i), child, wait_status);
          on_exit(result_.exits[i]);
        } else {
          result_.exits[i].index = static_cast<int>(i);  // reaped elsewhere: status unknown
          result_.exits[i].pid = child.pid;
        }
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
    if (!result_.first_failure) {
      result_.outcome = Outcome::kFailed;
      result_.exit_status = exit.status;
      result_.first_failure = exit;
      if (exit.status == kExitCommFailure && options_.settle_s > 0) {
        settle_deadline_ = Clock::now() + to_duration(options_.settle_s);
        return;  // let the peer that went away report its own status first
      }
    }
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

  void on_timeout() {
    result_.outcome = Outcome::kTimedOut;
    result_.exit_status = kExitTimedOut;
    begin_stopping(SIGTERM);
  }

  void begin_stopping(int sig) {
    stopping_ = true;
    for (auto& child : children_) {
      if (!child.running) continue;
      ++result_.stopped;
      signal_child(child, sig);
    }
    kill_deadline_ = Clock::now() + to_duration(options_.grace_s);
  }

  static Clock::duration to_duration(double seconds) {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  }
  static double seconds_until(Clock::time_point deadline, Clock::time_point now) {
    return std::chrono::duration<double>(deadline - now).count();
  }

  const SupervisorOptions& options_;
  const SignalBlock& signals_;
  std::vector<Child> children_;
  SupervisionResult result_;
  bool stopping_ = false;
  std::optional<Clock::time_point> settle_deadline_;  // set while a comm failure settles
  std::optional<Clock::time_point> kill_deadline_;     // SIGKILL the rest at this time
  Clock::time_point timeout_deadline_ = Clock::time_point::max();  // stop all then; max = never
};

}  // namespace

SupervisionResult supervise(const std::vector<ProcessSpec>& specs,
                            const SupervisorOptions& options) {
  TORCH_CHECK(!specs.empty(), "supervise: no processes to start");
  for (const auto& spec : specs) TORCH_CHECK(!spec.argv.empty(), "supervise: empty argv");
  TORCH_CHECK(options.grace_s >= 0 && options.timeout_s >= 0, "supervise: negative grace_s (",
              options.grace_s, ") or timeout_s (", options.timeout_s, ")");
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
