// The `ulysses-tune launch` subcommand: CLI wiring (CLI11) and the run: validate the run config,
// then either print torchrun/srun lines or start and supervise the local ranks of ulysses-train.
#pragma once
#include "tuner/launch/launch_plan.h"

namespace CLI {
class App;
}

namespace ulysses::launch {

// The writer named in the marker of a sweep's directory of trial runs (common/output_dir.h).
inline constexpr char kSweepRunsWriter[] = "ulysses-tune sweep";

// Adds the `launch` subcommand with its options and help to `app`; parsing writes into *options,
// which must outlive the parse. Returns the subcommand (check ->parsed() after parsing).
CLI::App* add_launch_command(CLI::App& app, LaunchOptions* options);

// Runs `launch` with parsed options and returns the process exit status: 0 when every rank exited
// 0, the first failing rank's status (128 + signal for a signal death) after stopping the others,
// kExitInterrupted when launch itself got SIGINT/SIGTERM (forwarded to the ranks). With --print,
// writes the cluster command lines to stdout and returns 0 without starting anything.
// Throws UserError (before any rank starts) for bad options, a run config that does not load or
// validate for world size nnodes * nproc, inputs that train::check_run_inputs rejects (missing
// data file, checkpoint.resume that does not exist, train.device cuda without CUDA; not checked
// with --print, whose ranks run elsewhere), an output.dir or checkpoint.dir inside a sweep's
// directory of trial runs (a job would write over a trial's files), or a trainer that is not an
// executable file. Prints one
// line to stderr naming the failing rank and its status, or the interrupting signal.
// REQUIRES: called from the main thread (see supervise()).
int run_launch(const LaunchOptions& options);

}  // namespace ulysses::launch
