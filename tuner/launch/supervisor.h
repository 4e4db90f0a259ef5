// Starts a group of local processes (the ranks of one node) and supervises them like torchrun
// does: one failing process stops the others, SIGINT/SIGTERM to the caller stop all of them, an
// optional timeout stops all of them, and no process outlives supervise() or a killed caller.
#pragma once
#include <sys/types.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ulysses::launch {

// One process to start.
struct ProcessSpec {
  ProcessSpec() = default;
  ProcessSpec(std::vector<std::string> argv_, std::vector<std::string> env_)
      : argv(std::move(argv_)), env(std::move(env_)) {}

  std::vector<std::string> argv;  // argv[0] is the executable's path (no PATH lookup); non-empty
  std::vector<std::string> env;   // the child's whole environment, "KEY=VALUE" entries
  // Files the child's stdout / stderr go to, created (mode 0644) or truncated; "" = inherit the
  // caller's. The same path for both gives one file with both streams in write order.
  std::string stdout_path;
  std::string stderr_path;
};

struct SupervisorOptions {
  // Seconds between SIGTERM (or the forwarded signal) and SIGKILL when stopping processes.
  double grace_s = 5.0;
  // Seconds after the start after which every process still running is stopped (kTimedOut);
  // 0 = no timeout.
  double timeout_s = 0.0;
  // When the first failure is a communication failure (exit kExitCommFailure: a peer went away),
  // the other processes get up to this long to end by themselves before they are stopped, so
  // that the peer that ran out of memory or crashed reports its own status (the cause). 0 = stop
  // at once. Any other failure in that window ends it. The timeout still applies during the
  // window; reaching it there stops the processes and keeps the failure as the outcome.
  double settle_s = 0.0;
};

// exit_status of a supervision that timed out (as timeout(1) exits).
inline constexpr int kExitTimedOut = 124;

// How one process ended. status is its exit code, or 128 + signal when a signal killed it.
struct ProcessExit {
  int index = -1;   // position in the specs given to supervise()
  pid_t pid = -1;
  int status = 0;
  int signal = 0;   // the signal that killed it; 0 when it exited
  // True when `signal` is one the supervisor had sent it (stopping); false for a signal from
  // elsewhere (the kernel's OOM killer, a crash, another process) and for exits.
  bool signalled_by_us = false;
};

enum class Outcome {
  kAllSucceeded,  // every process exited 0
  kFailed,        // a process exited non-zero or died from a signal: see first_failure
  kInterrupted,   // the caller received SIGINT or SIGTERM first: see interrupt_signal
  kTimedOut,      // options.timeout_s passed first; every process still running was stopped
};

struct SupervisionResult {
  Outcome outcome = Outcome::kAllSucceeded;
  // 0; first_failure->status; kExitInterrupted (common/error.h) when interrupted; kExitTimedOut
  // when timed out.
  int exit_status = 0;
  std::optional<ProcessExit> first_failure;  // set iff outcome == kFailed
  int interrupt_signal = 0;                  // set iff outcome == kInterrupted
  int stopped = 0;  // processes still running when stopping began (signalled by us)
  // How every process ended, by index (exits[i].index == i), also those that ended after
  // stopping began. Empty only when supervise() threw.
  std::vector<ProcessExit> exits;
};

// Starts every spec as a child process and waits until all of them have ended.
//
// Each child runs in its own process group (so that stopping a rank also reaches anything it
// started), inherits the caller's stdin and (unless redirected by the spec) stdout/stderr, and gets
// PR_SET_PDEATHSIG = SIGKILL so that it dies when the caller dies. When a child exits non-zero or
// dies from a signal, the first such child is the failure: every other child's group gets SIGTERM,
// then SIGKILL after grace_s. When options.timeout_s > 0 passes before every child has ended and
// before any failure or interrupt, every running child's group is stopped the same way and the
// outcome is kTimedOut.
// SIGINT/SIGTERM received by the caller while supervising are forwarded to every child's group
// (a second one sends SIGKILL at once); children still alive grace_s later get SIGKILL. Children
// ending after stopping began are not failures.
//
// Returns when every child has been reaped; never leaves a child behind, also when it throws.
// Throws std::system_error when an output file cannot be opened (before any child starts) or a
// child cannot be created (children already started are killed and reaped first). An exec
// failure in the child shows as a child exiting 127 (the reason on its stderr).
// REQUIRES: specs non-empty, every argv non-empty; options.grace_s >= 0, options.timeout_s >= 0;
// no thread of the process may take SIGINT, SIGTERM or SIGCHLD meanwhile (they are blocked in the
// calling thread, and the previous signal mask is restored on return). Several threads may each
// supervise their own children at once when every thread has them blocked (a sweep's slots):
// each then polls for its children's exits. Children start with the caller's mask less those
// three.
SupervisionResult supervise(const std::vector<ProcessSpec>& specs,
                            const SupervisorOptions& options);

// "exited with status 3" or "was killed by signal 9 (Killed); status 137".
std::string describe_exit(const ProcessExit& exit);

}  // namespace ulysses::launch
