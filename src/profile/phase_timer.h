// Per-step time by phase and by category, and the NVTX ranges that go with it.
//
// A ScopedPhase is one scope seen three ways: an NVTX range in domain "ulysses" with its
// category (profile/nvtx.h), its inclusive time under its name in the step's `phases`, and its
// exclusive time (its own time minus that of the timed scopes nested in it) in its category.
// So the four category totals add up to the time spent inside top-level scopes, without
// double counting: "forward" 10 ms holding "a2a" 2 ms and "attention" 3 ms gives phases
// {forward 10, a2a 2, attention 3} and compute 8, comm 2.
//
// Timing: on CPU (the default) the steady clock at scope entry and exit. After
// set_timing_device(cuda:N), CUDA events recorded on the current stream of that device, read in
// take_step_times() (which waits for them), so a scope's time is what the device's stream spent
// between its entry and exit, including waits for collectives it issued.
//
// Comm wait: the timers measure the issuing (compute) stream, which waits for every collective
// of this stack (all are blocking, comm/group.h), so the comm time measured here is comm the
// compute stream waited on (comm_wait_ms == comm_ms). How much comm a kernel-level schedule
// hides behind compute is not visible here: `ulysses-tune profile` (nsys) measures that overlap.
//
// Scopes nest across threads (autograd's device threads run backward scopes while the caller
// waits inside backward()), so the open-scope stack is process-wide. Thread-safe.
#pragma once
#include <c10/core/Device.h>

#include <cstdint>
#include <map>
#include <string>

#include "profile/category.h"

namespace ulysses::profile {

// Milliseconds per phase name.
using PhaseTimes = std::map<std::string, double>;

// The times accumulated since the last take.
struct StepTimes {
  PhaseTimes phases;        // inclusive ms per scope name ("a2a", "attention", "forward", ...)
  double compute_ms = 0.0;  // exclusive ms per category
  double comm_ms = 0.0;
  double offload_ms = 0.0;
  double optimizer_ms = 0.0;
  double comm_wait_ms = 0.0;  // comm the compute stream waited on (== comm_ms, see above)

  // compute + comm + offload + optimizer: the time inside top-level timed scopes.
  double categorized_ms() const { return compute_ms + comm_ms + offload_ms + optimizer_ms; }
};

// Returns the times accumulated so far and resets them. On CUDA, first waits for the events of
// closed scopes. Scopes still open are counted when they close, in the next take.
StepTimes take_step_times();

// take_step_times().phases.
PhaseTimes take_phase_times();

// Adds `ms` to phase `name` and to category default_category(name), as a top-level scope.
void add_phase_time(const std::string& name, double ms);

// Where scopes are timed: CPU (steady clock, the default) or a CUDA device (events on its
// current stream). Call before the first scope of a run; scopes already closed keep their
// clock. REQUIRES: a CUDA device only in builds with ULYSSES_WITH_CUDA (TORCH_CHECK).
void set_timing_device(const c10::Device& device);

// Turns NVTX ranges on or off at run time (profile.nvtx); on by default. No effect when NVTX is
// not compiled in.
void enable_nvtx(bool enabled);
// True when src/profile was built with the NVTX3 headers (ULYSSES_HAS_NVTX).
bool nvtx_compiled_in();

// Times the enclosing scope into phase `name` and `category`, inside an NVTX range of that name
// and category. The one-argument form takes default_category(name), so ScopedPhase("a2a") is
// comm and ScopedPhase("attention") compute.
// REQUIRES: `name` outlives the scope; constructed and destroyed on one thread, nested (LIFO)
// with the other scopes.
// Work issued to another stream than the enclosing scopes' (the CUDA checkpoint offload copies on
// their side stream) is timed with kOverlapped, constructed while that stream is current: its
// events are recorded on it, and its time counts in its phase and category but is not taken out
// of the enclosing scope, which it ran beside, not inside; scopes opened within it nest in the
// enclosing scope.
struct Overlapped {};
inline constexpr Overlapped kOverlapped{};

class ScopedPhase {
 public:
  explicit ScopedPhase(const char* name);
  ScopedPhase(const char* name, Category category);
  ScopedPhase(const char* name, Overlapped);
  ~ScopedPhase();
  ScopedPhase(const ScopedPhase&) = delete;
  ScopedPhase& operator=(const ScopedPhase&) = delete;

 private:
  ScopedPhase(const char* name, Category category, bool overlapped);

  const char* name_;
  Category category_;
  Category parent_ = Category::kNone;  // category of the innermost enclosing categorized scope
  uint64_t id_ = 0;
  double start_ms_ = 0.0;        // CPU timing
  void* start_event_ = nullptr;  // CUDA timing: a cudaEvent_t
  bool nvtx_pushed_ = false;
  bool overlapped_ = false;  // not on the open-scope stack; the parent keeps its time
};

// An NVTX range only (no timing): one per training step ("step", payload = step number; usable
// as an nsys capture range, `--nvtx-capture=step@ulysses`) and one per decoder layer ("layer",
// payload = layer index). payload < 0 attaches none.
// REQUIRES: `name` outlives the scope; constructed and destroyed on one thread.
class ScopedRange {
 public:
  explicit ScopedRange(const char* name, int64_t payload = -1, Category category = Category::kNone);
  ~ScopedRange();
  ScopedRange(const ScopedRange&) = delete;
  ScopedRange& operator=(const ScopedRange&) = delete;

 private:
  bool pushed_;
};

}  // namespace ulysses::profile
