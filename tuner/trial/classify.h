// How a trial ended, decided from its ranks' exit statuses only, never from
// what they printed; the ranks' stderr only supplies the error text. Statuses are the strings of
// store::kTrialStatuses.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tuner/launch/supervisor.h"

namespace ulysses::trial {

struct Classification {
  // ok | oom | failed | timeout | killed; "running" when the caller was interrupted (no result).
  std::string status;
  // The deciding rank's exit status (128 + signal for a signal death); 0 for ok and for "no
  // summary"; 124 for our timeout; nullopt when interrupted.
  std::optional<int64_t> exit_code;
  int rank = -1;      // the rank whose exit decided an oom / failed / killed / its own 124; else -1
  std::string error;  // one line; "" for ok
};

// Decides a trial's status from how its ranks ended (`result`, one process per rank, index =
// rank) and whether rank 0's summary.json could be read:
//   every rank 0 + summary -> ok;  every rank 0, no summary -> failed ("rank 0 wrote no
//   summary.json");  our timeout -> timeout ("timed out after N s", then "; " and the first
//   non-empty line among the ranks' stderr);  interrupted -> running ("interrupted by signal N").
// Otherwise the first failing rank decides, except that a comm failure (13: a peer went away)
// yields to another rank that exited 12 or died from a signal we did not send (the cause the
// comm failure saw): a signal -> killed; 12 -> oom; 124 -> timeout; anything else -> failed.
// error = that rank's last stderr line, or "rank R <describe_exit>" when it wrote none.
// `last_stderr_lines[i]` is rank i's last non-empty stderr line ("" when none; missing entries
// count as ""). Pure function: touches no files.
Classification classify(const launch::SupervisionResult& result, bool summary_readable,
                        const std::vector<std::string>& last_stderr_lines, double timeout_s);

// The line of a rank's stderr file at `path` that says why it failed, from the file's last 64 KiB
// with trailing whitespace removed; "" when the file is missing or holds no such line.
// Skipped: blank lines, progress output (what a carriage return overwrote, tqdm bars
// "NN%|###   | n/N [...]"), warnings ("warning: ...", "FooWarning: ...", "[WARNING]", c10's
// "[W... ] ..."), and stack frames (Python's "Traceback ..." and indented frame/code lines,
// c10's "frame #N: ..." and "Exception raised from ..."). Of the lines left, the last one that
// states an error ("error: ...", "out of memory: ...", "communication failed: ...", an exception
// "FooError: ..." / "FooException: ...", "[ERROR]") is chosen, else the last one; with none
// left, the last warning, else the last non-blank line that is not progress output. A rank that
// prints one error line last (ulysses-train's do) gets that line.
std::string last_nonempty_line(const std::string& path);

// last_nonempty_line on the text itself. Pure function.
std::string error_line_of(const std::string& text);

}  // namespace ulysses::trial
