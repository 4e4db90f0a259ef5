// Per-step wall-clock time by phase ("a2a", "attention", "forward", "grad_sync", ...).
// Scopes nest and each phase counts its own inclusive time. On CPU the steady clock is exact;
// on CUDA a scope synchronizes nothing, so GPU phases are launch times until the profiling layer
// adds events (SPEC 6).
#pragma once
#include <chrono>
#include <map>
#include <string>

namespace ulysses::profile {

// Milliseconds per phase name, accumulated since the last take_phase_times() on this process.
using PhaseTimes = std::map<std::string, double>;

// Returns the times accumulated so far and resets them. Not thread-safe: the training loop is
// single-threaded per rank.
PhaseTimes take_phase_times();

// Adds `ms` to phase `name`.
void add_phase_time(const std::string& name, double ms);

// Times the enclosing scope into phase `name` (REQUIRES: name outlives the scope).
class ScopedPhase {
 public:
  explicit ScopedPhase(const char* name)
      : name_(name), start_(std::chrono::steady_clock::now()) {}
  ~ScopedPhase() {
    add_phase_time(name_, std::chrono::duration<double, std::milli>(
                              std::chrono::steady_clock::now() - start_)
                              .count());
  }
  ScopedPhase(const ScopedPhase&) = delete;
  ScopedPhase& operator=(const ScopedPhase&) = delete;

 private:
  const char* name_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace ulysses::profile
