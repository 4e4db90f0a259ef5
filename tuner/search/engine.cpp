// Grid, max-length bisection with probes and implications, and dominance for throughput
// (see engine.h).
#include "tuner/search/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "tuner/search/knowledge.h"

namespace ulysses::search {
namespace {

std::string trial_ref(int64_t id) { return "trial #" + std::to_string(id); }

// One unit of the search (engine.h): its body runs under the engine's lock, and `deps` are the
// indices of earlier units of the same phase it waits for.
struct Unit {
  std::function<void()> body;
  std::vector<size_t> deps;
};

class Engine {
 public:
  Engine(const Space& space, const Options& options, Host& host)
      : space_(space), options_(options), host_(host), n_(static_cast<int>(space.lengths.size())),
        knowledge_(space) {}

  Summary run() {
    std::vector<Point> valid;
    for (const Point& p : all_points(space_)) {
      if (std::optional<std::string> why = host_.invalid_reason(p)) {
        host_.record(p, 0, "invalid", *why);
        ++summary_.invalid;
      } else {
        valid.push_back(p);
      }
    }
    summary_.grid_runs = static_cast<int64_t>(valid.size()) * n_;
    if (options_.method == "grid") {
      grid(valid);
    } else if (space_.search_max) {
      max_length(valid);
    } else {
      throughput(valid);
    }
    return summary_;
  }

 private:
  // Runs the units of one phase: in order in this thread (one worker), or side by side as
  // engine.h says. Returns when every started unit has ended; rethrows the first exception.
  void run_units(std::vector<Unit>& units) {
    if (options_.workers <= 1) {
      std::unique_lock<std::mutex> lock(mutex_);
      lock_ = &lock;
      for (Unit& unit : units) {
        if (stopped_) break;
        unit.body();
      }
      lock_ = nullptr;
      return;
    }
    std::vector<char> done(units.size(), 0);
    std::vector<std::thread> threads;
    int active = 0;
    std::unique_lock<std::mutex> lock(mutex_);
    next_decider_ = 0;
    // Waits for `ready` while calling Host::idle about every 0.1 s; an exception from it stops
    // the search.
    auto wait = [&](const std::function<bool()>& ready) {
      while (!ready()) {
        if (wake_.wait_for(lock, std::chrono::milliseconds(100), ready)) break;
        lock.unlock();
        try {
          host_.idle();
        } catch (...) {
          lock.lock();
          if (!error_) error_ = std::current_exception();
          stopped_ = true;
          continue;
        }
        lock.lock();
      }
    };
    for (size_t k = 0; k < units.size() && !stopped_; ++k) {
      wait([&] {
        if (stopped_) return true;
        if (active >= options_.workers) return false;
        for (size_t d : units[k].deps) {
          if (!done[d]) return false;
        }
        return true;
      });
      if (stopped_) break;
      ++active;
      // A thread that cannot be made (the system's limits) stops the search as an exception in
      // a unit does: the units started go on to their end and the error reaches the caller.
      try {
        threads.emplace_back([this, &units, &done, &active, k] {
          std::unique_lock<std::mutex> unit_lock(mutex_);
          // Units decide in start order: a unit takes its first decision (skip, or start a run)
          // only after every earlier unit took its own, whichever thread gets the lock first.
          wake_.wait(unit_lock, [&] { return stopped_ || next_decider_ == k; });
          lock_ = &unit_lock;
          holds_ticket_ = true;
          try {
            if (!stopped_) units[k].body();
          } catch (...) {
            if (!error_) error_ = std::current_exception();
            stopped_ = true;
          }
          pass_ticket();
          lock_ = nullptr;
          done[k] = 1;
          --active;
          wake_.notify_all();
        });
      } catch (...) {
        --active;
        if (!error_) error_ = std::current_exception();
        stopped_ = true;
        wake_.notify_all();  // units waiting for their ticket see the stop
      }
    }
    wait([&] { return active == 0; });
    lock.unlock();
    for (std::thread& t : threads) t.join();
    lock.lock();
    if (error_) {
      std::exception_ptr error = error_;
      lock.unlock();
      std::rethrow_exception(error);
    }
  }

  // Every valid point at every length, no implications, no pruning.
  void grid(const std::vector<Point>& valid) {
    std::vector<Unit> units;
    for (const Point& p : valid) {
      for (int i = 0; i < n_; ++i) {
        units.push_back({[this, p, i] {
                           if (budget_spent_ || !start_run()) return;
                           execute(p, i, false);
                         },
                         {}});
      }
    }
    run_units(units);
  }

  // Sorts by saving score (ascending or descending), then by the host's predicted value at
  // `length` (highest first; points without a prediction after those with one, in space order).
  // The saving order comes first: dominance and implications need the less-saving (throughput)
  // or more-saving (max length) points measured first; the prediction orders the rest, e.g. the
  // meshes, which have no memory order.
  void order(std::vector<Point>& points, bool fewest_savings_first, int64_t length) {
    std::vector<std::pair<Point, std::optional<double>>> keyed;
    for (const Point& p : points) keyed.emplace_back(p, host_.predicted_value(p, length));
    std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
      const int sa = saving_score(space_, a.first), sb = saving_score(space_, b.first);
      if (sa != sb) return fewest_savings_first ? sa < sb : sa > sb;
      if (a.second.has_value() != b.second.has_value()) return a.second.has_value();
      return a.second.has_value() && *a.second > *b.second;
    });
    for (size_t i = 0; i < points.size(); ++i) points[i] = keyed[i].first;
  }

  // Each length, fastest-looking points (fewest savings, then the best prediction) first; skip
  // what is implied out of memory, pruned, or dominated by a point with fewer savings that fits.
  void throughput(std::vector<Point> valid) {
    std::vector<Unit> units;
    std::vector<std::pair<Point, int>> keys;  // (point, length index) of each unit
    for (int i = 0; i < n_; ++i) {
      order(valid, /*fewest_savings_first=*/true, space_.lengths[i]);
      for (const Point& p : valid) {
        Unit unit;
        for (size_t k = 0; k < keys.size(); ++k) {  // earlier units whose runs could decide it
          const auto& [q, j] = keys[k];
          const bool implies_oom = saves_at_least(space_, q, p);
          const bool dominates =
              j == i && options_.saving_costs_time && q != p && cannot_be_faster(space_, p, q);
          if (implies_oom || dominates) unit.deps.push_back(k);
        }
        unit.body = [this, p, i] {
          if (budget_spent_) return;  // the one-worker search stops here
          if (std::optional<int64_t> id = knowledge_.implied_oom(p, i, false)) {
            skip(p, i, "out of memory implied by " + trial_ref(*id) +
                           " (saves at least as much memory at a length <= this one)");
          } else if (std::optional<int64_t> id = knowledge_.dominating_fit(p, i);
                     id && options_.saving_costs_time) {
            skip(p, i,
                 "dominated by " + trial_ref(*id) +
                     ": it fits at this length with fewer memory savings (savings cost time)");
          } else if (!pruned(p, i)) {
            if (!start_run()) return;
            execute(p, i, false);
          }
        };
        keys.emplace_back(p, i);
        units.push_back(std::move(unit));
      }
    }
    run_units(units);
  }

  // The longest fitting length of each point, most-saving points first (their out-of-memory
  // bounds every point below them, and the first to fit sets the length the rest must reach);
  // points that cannot reach the best length are skipped.
  void max_length(std::vector<Point> valid) {
    // Equal savings: the best predicted value at the longest length first.
    order(valid, /*fewest_savings_first=*/false, space_.lengths.back());
    longest_.assign(valid.size(), -1);
    settled_at_.assign(valid.size(), -1);
    std::vector<Unit> units;
    for (size_t k = 0; k < valid.size(); ++k) {
      Unit unit;
      for (size_t j = 0; j < k; ++j) {
        if (j == 0 || saves_at_least(space_, valid[j], valid[k]) ||
            saves_at_least(space_, valid[k], valid[j])) {
          unit.deps.push_back(j);
        }
      }
      const std::vector<size_t> deps = unit.deps;
      unit.body = [this, &valid, k, deps] {
        if (budget_spent_) return;  // the one-worker search stops here
        int best = -1;  // the longest fit among the points this one waited for
        for (size_t j : deps) best = std::max(best, longest_[j]);
        search_point(valid[k], k, best);
      };
      units.push_back(std::move(unit));
    }
    run_units(units);
    if (budget_spent_) return;
    std::vector<std::pair<Point, int>> settled;  // in the order of the points
    for (size_t k = 0; k < valid.size(); ++k) {
      if (settled_at_[k] >= 0) settled.emplace_back(valid[k], settled_at_[k]);
    }
    curve(settled);
  }

  // One point's length search (max_length): sets longest_[k] (the longest fit it found, or
  // -1 when it does not compete) and settled_at_[k] (that index when settled). Sets
  // budget_spent_ when the budget ran out.
  void search_point(const Point& p, size_t k, int best) {
    int lo = -1, hi = n_;
    std::optional<int64_t> hi_id;
    for (int i = 0; i < n_; ++i) {
      if (knowledge_.implied_fit(p, i, false)) lo = i;
    }
    for (int i = n_ - 1; i > lo; --i) {
      if (std::optional<int64_t> id = knowledge_.implied_oom(p, i, false)) hi = i, hi_id = id;
    }
    if (hi <= best) {
      skip(p, -1, "cannot reach the longest fitting length so far (" +
                     std::to_string(space_.lengths[best]) + "): out of memory at " +
                     std::to_string(space_.lengths[hi]) + " implied by " + trial_ref(*hi_id));
      return;
    }
    std::set<int> failed;  // lengths where a real run of p failed: they bound nothing
    if (best >= 0 && lo < best) {  // one run at the best length decides whether p competes
      std::optional<Result> r = test(p, best, false);
      if (!r) return spent();
      if (*r == Result::kOom) return;
      if (*r == Result::kFits) {
        lo = best;
      } else {
        failed.insert(best);  // undecided: p's own search goes on around it
      }
    }
    if (options_.probe && hi - lo > 1) {
      int probe_lo = lo, probe_hi = hi;
      for (int i = lo + 1; i < hi; ++i) {
        if (knowledge_.implied_fit(p, i, true)) probe_lo = i;
      }
      for (int i = hi - 1; i > probe_lo; --i) {
        if (knowledge_.implied_oom(p, i, true)) probe_hi = i;
      }
      std::set<int> probe_failed;
      if (!bisect(p, probe_lo, probe_hi, true, false, probe_failed)) return spent();
      hi = std::min(hi, probe_hi);  // a probe's out-of-memory is a real one (not its failure)
    }
    if (!bisect(p, lo, hi, false, options_.probe, failed)) return spent();
    if (hi - lo > 1) not_settled(p, lo, hi, failed);
    if (hi - lo == 1 && lo >= 0) settled_at_[k] = lo;
    longest_[k] = lo;
  }

  void spent() { budget_spent_ = true; }

  // Each settled point at space_.curve shorter lengths, evenly spread below its longest fit
  // (index round(lo * k / (curve + 1)), k = 1..curve), unless already measured there; in the
  // order the points settled, so a spent budget leaves the most-saving points' curves whole.
  void curve(const std::vector<std::pair<Point, int>>& settled) {
    std::vector<Unit> units;
    for (const auto& [p, lo] : settled) {
      std::set<int> lengths;
      for (int k = 1; k <= space_.curve; ++k) {
        const double at = static_cast<double>(lo) * k / (space_.curve + 1);
        const int i = static_cast<int>(std::lround(at));
        if (i < lo && !measured_.count({p, i})) lengths.insert(i);
      }
      for (int i : lengths) {
        units.push_back({[this, p = p, i] {
                           if (budget_spent_ || pruned(p, i)) return;
                           if (!start_run()) return spent();
                           execute(p, i, false);
                         },
                         {}});
      }
    }
    run_units(units);
  }

  // Narrows (lo, hi), where lo fits (or is -1) and hi does not (or is n), to adjacent indices
  // by running p: brackets upward by doubling the length while no upper bound is known, then
  // bisects. confirm_first: try hi - 1 first (the longest length a probe fitted at). A run that
  // fails (not out of memory) bounds nothing: its index joins `failed` and a neighbour is tried
  // instead (the shorter first); after kMaxFailuresPerPoint failures, or when every index left
  // in (lo, hi) failed, it stops with the bracket open. False: the budget is spent.
  bool bisect(const Point& p, int& lo, int& hi, bool probe, bool confirm_first,
              std::set<int>& failed) {
    bool first = true;
    while (hi - lo > 1 && static_cast<int>(failed.size()) < kMaxFailuresPerPoint) {
      int mid;
      if (first && confirm_first) {
        mid = hi - 1;
      } else if (lo < 0) {
        mid = 0;
      } else if (hi >= n_) {
        const int64_t doubled = 2 * space_.lengths[lo];
        mid = lo + 1;
        while (mid < n_ - 1 && space_.lengths[mid] < doubled) ++mid;
      } else {
        mid = (lo + hi) / 2;
      }
      first = false;
      if (failed.count(mid)) {  // the nearest untried index inside the bracket, shorter first
        int pick = -1;
        for (int d = 1; pick < 0 && (mid - d > lo || mid + d < hi); ++d) {
          if (mid - d > lo && !failed.count(mid - d)) {
            pick = mid - d;
          } else if (mid + d < hi && !failed.count(mid + d)) {
            pick = mid + d;
          }
        }
        if (pick < 0) break;  // every length left inside failed
        mid = pick;
      }
      std::optional<Result> r = test(p, mid, probe);
      if (!r) return false;
      if (*r == Result::kFits) {
        lo = mid;
      } else if (*r == Result::kOom) {
        hi = mid;
      } else {
        failed.insert(mid);
      }
    }
    return true;
  }

  // Records that p's longest fitting length is open between lo and hi because runs failed.
  void not_settled(const Point& p, int lo, int hi, const std::set<int>& failed) {
    std::string lengths;
    for (int i : failed) {
      lengths += (lengths.empty() ? "" : ", ") + std::to_string(space_.lengths[i]);
    }
    skip(p, -1,
         "longest fitting length not settled: " +
             (lo >= 0 ? "fits at " + std::to_string(space_.lengths[lo]) : "no fit found") +
             (hi < n_ ? ", out of memory at " + std::to_string(space_.lengths[hi]) : "") +
             "; runs failed at " + lengths + " (not a memory result)" +
             (static_cast<int>(failed.size()) >= kMaxFailuresPerPoint ? ", search stopped" : ""));
  }

  // The result of p at index i: implied, pruned (does not fit), or run. nullopt: budget spent.
  std::optional<Result> test(const Point& p, int i, bool probe) {
    if (knowledge_.implied_fit(p, i, probe)) return Result::kFits;
    if (knowledge_.implied_oom(p, i, probe)) return Result::kOom;
    if (pruned(p, i)) return Result::kOom;
    if (!start_run()) return std::nullopt;
    return execute(p, i, probe).result;
  }

  bool pruned(const Point& p, int i) {
    if (!options_.prune) return false;
    std::optional<std::string> why = host_.prune_reason(p, space_.lengths[i]);
    if (!why) return false;
    host_.record(p, space_.lengths[i], "pruned", *why);
    ++summary_.pruned;
    return true;
  }

  // i: a length index, or -1 for every length of p.
  void skip(const Point& p, int i, const std::string& reason) {
    host_.record(p, i < 0 ? 0 : space_.lengths[i], "skipped", reason);
    ++summary_.skipped;
  }

  // False when no further run may start: the budget is spent (then recorded) or the search
  // is stopping.
  bool start_run() {
    if (stopped_) return false;
    if (host_.budget_left()) return true;
    summary_.budget_exhausted = true;
    budget_spent_ = true;
    return false;
  }

  // The calling unit has taken its first decision: the next unit may take its own.
  void pass_ticket() {
    if (!holds_ticket_) return;
    holds_ticket_ = false;
    ++next_decider_;
    wake_.notify_all();
  }

  // Runs p at index i through the host without the engine's lock (other units decide meanwhile).
  RunOutcome execute(const Point& p, int i, bool probe) {
    pass_ticket();
    lock_->unlock();
    RunOutcome out;
    try {
      out = host_.run(p, space_.lengths[i], probe);
    } catch (...) {
      lock_->lock();
      throw;
    }
    lock_->lock();
    if (!out.ran) {
      ++summary_.invalid_at_length;
      return out;
    }
    ++(probe ? summary_.probes : summary_.runs);
    if (out.result != Result::kFailed) {
      knowledge_.add(p, i, out.result == Result::kFits, probe, out.trial_id);
    }
    if (out.result == Result::kFits && !probe) measured_.insert({p, i});
    return out;
  }

  const Space& space_;
  const Options& options_;
  Host& host_;
  const int n_;
  // Guards everything below; held by the unit that decides (lock_ is its lock, one per thread).
  std::mutex mutex_;
  std::condition_variable wake_;  // a unit ended, or passed its ticket
  static thread_local std::unique_lock<std::mutex>* lock_;
  // Several workers: the index of the unit whose turn it is to take its first decision, and
  // whether the calling thread's unit still holds that turn.
  size_t next_decider_ = 0;
  static thread_local bool holds_ticket_;
  Knowledge knowledge_;
  std::set<std::pair<Point, int>> measured_;  // real runs that fit: (point, length index)
  Summary summary_;
  std::vector<int> longest_;     // max length: each point's longest fit (-1: none or dropped)
  std::vector<int> settled_at_;  // max length: its index when settled, else -1
  bool budget_spent_ = false;    // a run was refused by the budget: no unit starts a run
  bool stopped_ = false;         // an exception: no unit starts
  std::exception_ptr error_;
};

thread_local std::unique_lock<std::mutex>* Engine::lock_ = nullptr;
thread_local bool Engine::holds_ticket_ = false;

}  // namespace

Summary run_search(const Space& space, const Options& options, Host& host) {
  return Engine(space, options, host).run();
}

}  // namespace ulysses::search
