// Starts a group of local processes (the ranks of one node) and supervises them like torchrun
// does: one failing process stops the others, SIGINT/SIGTERM to the caller stop all of them, and
// no process outlives supervise() or a killed caller.
#pragma once
#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

namespace ulysses::launch {

// One process to start.
struct ProcessSpec {
  std::vector<std::string> argv;  // argv[0] is the executable's path (no PATH lookup); non-empty
  std::vector<std::string> env;   // the child's whole environment, "KEY=VALUE" entries
};

struct SupervisorOptions {
  // Seconds between SIGTERM (or the forwarded signal) and SIGKILL when stopping processes.
  double grace_s = 5.0;
};

// How one process ended. status is its exit code, or 128 + signal when a signal killed it.
struct ProcessExit {
  int index = -1;   // position in the specs given to supervise()
  pid_t pid = -1;
  int status = 0;
  int signal = 0;   // the signal that killed it; 0 when it exited
};

enum class Outcome {
  kAllSucceeded,  // every process exited 0
  kFailed,        // a process exited non-zero or died from a signal: see first_failure
  kInterrupted,   // the caller received SIGINT or SIGTERM first: see interrupt_signal
};

struct SupervisionResult {
  Outcome outcome = Outcome::kAllSucceeded;
  // 0; first_failure->status; or kExitInterrupted (common/error.h) when interrupted.
  int exit_status = 0;
  std::optional<ProcessExit> first_failure;  // set iff outcome == kFailed
  int interrupt_signal = 0;                  // set iff outcome == kInterrupted
  int stopped = 0;  // processes still running when stopping began (signalled by us)
};

// Starts every spec as a child process and waits until all of them have ended.
//
// Each child runs in its own process group (so that stopping a rank also reaches anything it
// started), inherits the caller's stdin/stdout/stderr, and gets PR_SET_PDEATHSIG = SIGKILL so that
// it dies when the caller dies. When a child exits non-zero or dies from a signal, the first such
// child is the failure: every other child's group gets SIGTERM, then SIGKILL after grace_s.
// SIGINT/SIGTERM received by the caller while supervising are forwarded to every child's group
// (a second one sends SIGKILL at once); children still alive grace_s later get SIGKILL. Children
// ending after stopping began are not failures.
//
// Returns when every child has been reaped; never leaves a child behind, also when it throws.
// Throws std::system_error when a child cannot be created (children already started are killed
// and reaped first). An exec failure in the child shows as a child exiting 127.
// REQUIRES: specs non-empty; called from the process's main thread while no other thread of the
// process can take SIGINT, SIGTERM or SIGCHLD (they are blocked in the calling thread meanwhile
// and the previous signal mask is restored on return).
SupervisionResult supervise(const std::vector<ProcessSpec>& specs,
                            const SupervisorOptions& options);

// "exited with status 3" or "was killed by signal 9 (Killed); status 137".
std::string describe_exit(const ProcessExit& exit);

}  // namespace ulysses::launch
