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
//
// Runs side by side (Options::workers > 1, a sweep's slots). The search is cut into units, each
// decided in one go from what FINISHED runs say: a (point, length) of the grid, of the
// throughput search and of the curve; a point's whole length search (probe bisection, bisection,
// in its order) in the max-length search. Units start in the order the one-worker search takes
// them, at most `workers` at once, and take their first decision (skip, or start a run) in that
// order too, whichever thread gets the lock first; a unit starts only once every earlier unit
// whose runs could decide it has finished:
//   throughput: (p, L) waits for every earlier (q, L') with L' <= L where q saves at least as
//     much as p (its out-of-memory implies p's), and, at L' == L, every q that p cannot be faster
//     than (its fit dominates p);
//   max length: a point waits for every earlier point it is comparable with in the memory order
//     (their facts imply its fits and out-of-memory results) and for the first point (the lead:
//     most saving, best predicted); "the longest fitting length so far", which decides whether a
//     point competes, is the longest fit among exactly those points;
//   grid and curve units wait for nothing.
// So a unit reads the same facts whatever the number of workers, and the search's statuses and
// longest lengths do not depend on it; a unit that waits holds back the units after it (they
// start in order), so the runs started are the same too, up to a budget: which run the last of
// max_trials goes to may depend on timing where units of several points run at once. Knowledge
// is read and written under one lock, held by a unit except while Host::run runs.
// An exception from any unit or from Host::idle stops the search: no unit starts after it, the
// running runs are waited for (the host stops them), and the first exception is rethrown.
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
  // Options::workers > 1 only: called about every 0.1 s by the thread that called run_search
  // while it waits for units on other threads, without the engine's lock; it may throw to stop
  // the search (e.g. on a signal).
  virtual void idle() {}
};
// With Options::workers > 1, run() is called from up to `workers` threads at once (each call
// for a different (point, length, probe)); the other calls come one at a time, never at the same
// time as each other, but at the same time as run() calls.

// Failed runs (not out of memory) after which the max-length search of a point stops.
inline constexpr int kMaxFailuresPerPoint = 2;

struct Options {
  std::string method = "smart";  // smart | grid (every valid point at every length)
  bool probe = true;             // max-length search: probe before real runs
  bool prune = true;             // ask Host::prune_reason before running
  bool saving_costs_time = true; // skip points dominated in time (see above)
  int workers = 1;               // units run side by side (see above); 1 = in the caller's thread
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
