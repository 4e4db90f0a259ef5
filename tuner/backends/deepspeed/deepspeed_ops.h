// DeepSpeed's C++ ops (its shared-memory collectives, FusedAdam, CPUAdam), which DeepSpeed
// compiles on first use, built or loaded once before a sweep's first deepspeed trial (ds_ops.py
// beside this file) so that no trial compiles them inside its own timeout.
#pragma once
#include <string>
#include <vector>

namespace ulysses::backends {

// The op preparer: <project home>/tuner/backends/deepspeed/ds_ops.py.
std::string deepspeed_ops_script();

struct PreparedOps {
  std::string extensions_dir;  // where they were built: TORCH_EXTENSIONS_DIR/<op>/<op>.so
  std::vector<std::string> ops;  // DeepSpeed's op names (deepspeed_shm_comm, fused_adam, ...)
  double seconds = 0.0;          // how long building or loading them took
};

// Runs `python ds_ops.py prepare --device DEVICE` with no timeout: it builds every op a trial of
// the backend may load (or loads them when they are built) into torch's extensions directory
// (TORCH_EXTENSIONS_DIR, else torch's default under the user's cache directory), printing one
// progress line on stdout ("deepspeed backend: building DeepSpeed's CPU ops (...) once, into DIR
// ... done in N s"); the build's own output goes to a temporary log, removed when it succeeds.
// Then sets TORCH_EXTENSIONS_DIR and ULYSSES_DEEPSPEED_OPS_DIR to that directory in this
// process's environment, so that the trials, which inherit them, import the ops from where they
// were built as they are (no compiler, ninja or build lock in a trial).
// Throws UserError "deepspeed backend: DIR/OP/lock is left from a build of DeepSpeed's ops that
// was killed (...); remove it and run again" when a lock in an op's build directory has no live
// owner on this machine (nothing is deleted, nothing is built), and UserError "deepspeed backend:
// building DeepSpeed's ops failed: <its error> (the build's output: LOG)" when the build fails
// (the log is kept). SIGINT/SIGTERM stop the build (torch's lock is released) and end this
// process with kExitInterrupted after one line on stderr.
// REQUIRES: python can import deepspeed and torch; device "cpu" or "cuda"; called from the main
// thread before any trial runs (launch::supervise's requirements).
PreparedOps prepare_deepspeed_ops(const std::string& python, const std::string& device);

}  // namespace ulysses::backends
