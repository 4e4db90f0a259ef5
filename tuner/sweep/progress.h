// Terminal progress of a sweep: one line per finished trial with trial i of about N,
// elapsed time and ETA, and the best result so far.
#pragma once
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

namespace ulysses::sweep {

class Progress {
 public:
  // expected_runs: the runs the search is expected to start (an estimate; 0 = unknown).
  explicit Progress(int64_t expected_runs);

  // Prints "[i/~N 1m02s eta 3m10s] <what> -> <status> <detail> | best: <best>" to stdout.
  // replayed: a stored result (--resume), counted but not used for the time per trial.
  void finished(const std::string& what, const std::string& status, const std::string& detail,
                bool replayed = false);
  // Prints a line for a point or length not run ("pruned", "skipped", "invalid").
  void not_run(const std::string& what, const std::string& status, const std::string& reason);
  // Sets the best so far ("" = none yet).
  void set_best(const std::string& best) { best_ = best; }
  int64_t runs() const { return runs_; }
  double elapsed_s() const;

 private:
  int64_t expected_;
  int64_t runs_ = 0;
  int64_t replayed_ = 0;
  std::chrono::steady_clock::time_point start_;
  std::string best_;
};

// "1m02s", "45s", "2h03m".
std::string format_duration(double seconds);

}  // namespace ulysses::sweep
