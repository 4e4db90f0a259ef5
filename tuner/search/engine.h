// The search engine, generic over a Space (space.h): it decides which
// (point, length) to run and which to leave out, and asks a Host to run, record and check.
// It knows nothing of Ulysses or of processes; tests drive it with synthetic memory functions.
//
// What it exploits (all stated as data in the Space):
//   - memory is monotone in the axes' saving order and in the length: a fit of Q at L implies
//     a fit of every P that saves at least as much at every length <= L; an out-of-memory of Q
//     at L implies one for every P that saves at most as much at every length >= L;
//   - a memory probe (attention in the last layer only) needs no more memory than the real run,
//     so a probe's out-of-memory is a real one, and its fit bounds the real boundary from above;
//   - memory savings cost time on the axes that say so (Axis::saving_costs_time; assumed,
//     Options::saving_costs_time): a point that saves more than one that already fits at the
//     same length, differing only on such axes, cannot be faster, so it is skipped;
//   - a run that fails for another reason than memory (failed, timeout) says nothing about
//     memory: it bounds no bisection; a point whose longest fit it leaves open is recorded as
//     such (and its search stops after kMaxFailuresPerPoint failures).
//   - max-length search only: each point whose longest fit is settled is then measured at
//     Space::curve shorter lengths, so that throughput can be read against length.
// Every point or length it leaves out is recorded with its reason.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "tuner/search/space.h"

namespace ulysses::search {

enum class Result {
  kFits,    // ran and fits (within the host's head-room)
  kOom,     // ran out of memory (or exceeded the head-room)
  kFailed,  // failed for another reason: tells nothing about memory
};

struct RunOutcome {
  Result result = Result::kFailed;
  double value = 0.0;    // the objective metric when it fits (higher is better)
  int64_t trial_id = 0;  // for reasons that cite it
  // false: the host did not run it, since its length breaks a rule the point alone does not
  // (stored `invalid`); counted in Summary::invalid_at_length, not as a run (result kFailed).
  bool ran = true;
};

// What the engine needs from the sweep that uses it.
class Host {
 public:
  virtual ~Host() = default;
  // The reason `p` breaks a rule, or nullopt when it is valid.
  virtual std::optional<std::string> invalid_reason(const Point& p) = 0;
  // The reason the memory model says `p` cannot fit at `length`, or nullopt.
  virtual std::optional<std::string> prune_reason(const Point& p, int64_t length) = 0;
  // Runs (or, on resume, returns the stored result of) one trial.
  virtual RunOutcome run(const Point& p, int64_t length, bool probe) = 0;
  // Records a point that is not run: status "invalid", "pruned" or "skipped" with its reason.
  // length 0 = every length.
  virtual void record(const Point& p, int64_t length, const std::string& status,
                      const std::string& reason) = 0;
  // False once the budget is spent; the engine then starts no further run.
  virtual bool budget_left() = 0;
  // The cost model's prediction of the objective metric of `p` at `length` (higher is better),
  // or nullopt when there is none. The engine orders points of equal saving score by it, so the
  // likely winner is measured first; it never decides whether a point runs.
  virtual std::optional<double> predicted_value(const Point& p, int64_t length) {
    (void)p, (void)length;
    return std::nullopt;
  }
};

// Failed runs (not out of memory) after which the max-length search of a point stops.
inline constexpr int kMaxFailuresPerPoint = 2;

struct Options {
  std::string method = "smart";  // smart | grid (every valid point at every length)
  bool probe = true;             // max-length search: probe before real runs
  bool prune = true;             // ask Host::prune_reason before running
  bool saving_costs_time = true; // skip points dominated in time (see above)
};

struct Summary {
  int64_t runs = 0;      // real runs started by the engine
  int64_t probes = 0;    // probe runs
  int64_t skipped = 0;   // (point, length) pairs left out with a reason
  int64_t pruned = 0;
  int64_t invalid = 0;   // points
  int64_t invalid_at_length = 0;  // (point, length) pairs not run: invalid at that length only
  int64_t grid_runs = 0; // what the exhaustive grid runs: valid points x lengths
  bool budget_exhausted = false;
};

// Explores `space` with `host`. Returns what it did. Throws what the host throws.
Summary run_search(const Space& space, const Options& options, Host& host);

}  // namespace ulysses::search
