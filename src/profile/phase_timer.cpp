// Process-wide phase and category accumulator, CPU clock or CUDA events (see phase_timer.h).
#include "profile/phase_timer.h"

#include <c10/util/Exception.h>

#include <chrono>
#include <mutex>
#include <utility>
#include <vector>

#include "profile/nvtx.h"

#ifdef ULYSSES_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace ulysses::profile {
namespace {

double now_ms() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

#ifdef ULYSSES_WITH_CUDA
constexpr bool kCudaTiming = true;

// A closed scope whose time is still on the device.
struct PendingScope {
  std::string name;
  Category category;
  Category parent;
  cudaEvent_t start;
  cudaEvent_t end;
};
#else
constexpr bool kCudaTiming = false;
#endif

// Invariants: `open` lists the open ScopedPhase objects, outermost first; times are in ms.
struct TimerState {
  std::mutex mutex;
  std::vector<std::pair<uint64_t, Category>> open;  // (scope id, category)
  uint64_t next_id = 1;
  StepTimes totals;
  c10::Device device = c10::Device(c10::kCPU);
#ifdef ULYSSES_WITH_CUDA
  std::vector<PendingScope> pending;
  std::vector<cudaEvent_t> free_events;  // created on `device`, reused
#endif
};

// Never destroyed: scopes may close during static destruction.
TimerState& state() {
  static TimerState* timer_state = new TimerState;
  return *timer_state;
}

double& category_total(StepTimes& times, Category category) {
  switch (category) {
    case Category::kCompute:
      return times.compute_ms;
    case Category::kComm:
      return times.comm_ms;
    case Category::kOffload:
      return times.offload_ms;
    case Category::kOptimizer:
      return times.optimizer_ms;
    case Category::kNone:
      break;
  }
  TORCH_INTERNAL_ASSERT(false, "category_total: kNone has no total");
  return times.compute_ms;  // unreachable
}

// Adds a closed scope: inclusive time to its phase, exclusive time to the categories (its own
// category gains `ms`, the enclosing categorized scope loses it; a kNone scope moves nothing).
// REQUIRES: mutex held.
void accumulate(TimerState& s, const std::string& name, double ms, Category category,
                Category parent) {
  s.totals.phases[name] += ms;
  if (category == Category::kNone) return;  // transparent: its time stays with the parent
  category_total(s.totals, category) += ms;
  if (parent != Category::kNone) category_total(s.totals, parent) -= ms;
}

Category innermost_category(const TimerState& s) {
  for (auto it = s.open.rbegin(); it != s.open.rend(); ++it)
    if (it->second != Category::kNone) return it->second;
  return Category::kNone;
}

#ifdef ULYSSES_WITH_CUDA
// An event recorded now on the current stream of s.device. REQUIRES: mutex held.
cudaEvent_t record_event(TimerState& s) {
  c10::cuda::CUDAGuard guard(s.device.index());
  cudaEvent_t event = nullptr;
  if (!s.free_events.empty()) {
    event = s.free_events.back();
    s.free_events.pop_back();
  } else if (cudaEventCreate(&event) != cudaSuccess) {
    return nullptr;
  }
  cudaEventRecord(event, c10::cuda::getCurrentCUDAStream(s.device.index()).stream());
  return event;
}

// Waits for and adds every pending scope. REQUIRES: mutex held.
void resolve_pending(TimerState& s) {
  for (PendingScope& p : s.pending) {
    float ms = 0.0f;
    if (cudaEventSynchronize(p.end) == cudaSuccess &&
        cudaEventElapsedTime(&ms, p.start, p.end) == cudaSuccess) {
      accumulate(s, p.name, ms, p.category, p.parent);
    }
    s.free_events.push_back(p.start);
    s.free_events.push_back(p.end);
  }
  s.pending.clear();
}

// Bounds the events held when nobody takes the times (e.g. an evaluation loop).
constexpr size_t kMaxPendingScopes = 1 << 14;
#endif

}  // namespace

StepTimes take_step_times() {
  TimerState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
#ifdef ULYSSES_WITH_CUDA
  resolve_pending(s);
#endif
  StepTimes out = std::move(s.totals);
  s.totals = StepTimes{};
  out.comm_wait_ms = out.comm_ms;
  return out;
}

PhaseTimes take_phase_times() { return take_step_times().phases; }

void add_phase_time(const std::string& name, double ms) {
  TimerState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  accumulate(s, name, ms, default_category(name), Category::kNone);
}

void set_timing_device(const c10::Device& device) {
  TORCH_CHECK(device.is_cpu() || (device.is_cuda() && kCudaTiming),
              "set_timing_device: ", device.str(), " needs a build with ULYSSES_WITH_CUDA");
  TimerState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
#ifdef ULYSSES_WITH_CUDA
  resolve_pending(s);
  if (s.device != device) {
    for (cudaEvent_t e : s.free_events) cudaEventDestroy(e);
    s.free_events.clear();
  }
#endif
  s.device = device;
}

void enable_nvtx(bool enabled) { set_nvtx_enabled(enabled); }

bool nvtx_compiled_in() { return kNvtxCompiled; }

ScopedPhase::ScopedPhase(const char* name) : ScopedPhase(name, default_category(name)) {}

ScopedPhase::ScopedPhase(const char* name, Overlapped)
    : ScopedPhase(name, default_category(name), /*overlapped=*/true) {}

ScopedPhase::ScopedPhase(const char* name, Category category)
    : ScopedPhase(name, category, /*overlapped=*/false) {}

ScopedPhase::ScopedPhase(const char* name, Category category, bool overlapped)
    : name_(name), category_(category), overlapped_(overlapped) {
  nvtx_pushed_ = nvtx_push(name, category, -1);
  TimerState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  id_ = s.next_id++;
  // An overlapped scope takes nothing from its parent and is no parent of later scopes.
  parent_ = overlapped ? Category::kNone : innermost_category(s);
  if (!overlapped) s.open.emplace_back(id_, category);
#ifdef ULYSSES_WITH_CUDA
  if (s.device.is_cuda()) start_event_ = record_event(s);
  if (start_event_ != nullptr) return;
#endif
  start_ms_ = now_ms();
}

ScopedPhase::~ScopedPhase() {
  const double end_ms = now_ms();
  TimerState& s = state();
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    for (auto it = s.open.rbegin(); it != s.open.rend(); ++it) {
      if (it->first == id_) {
        s.open.erase(std::next(it).base());
        break;
      }
    }
#ifdef ULYSSES_WITH_CUDA
    if (start_event_ != nullptr) {
      cudaEvent_t start = static_cast<cudaEvent_t>(start_event_);
      cudaEvent_t end = record_event(s);
      if (end != nullptr) {
        s.pending.push_back({name_, category_, parent_, start, end});
        if (s.pending.size() > kMaxPendingScopes) resolve_pending(s);
      } else {
        s.free_events.push_back(start);
      }
    } else {
      accumulate(s, name_, end_ms - start_ms_, category_, parent_);
    }
#else
    accumulate(s, name_, end_ms - start_ms_, category_, parent_);
#endif
  }
  if (nvtx_pushed_) nvtx_pop();
}

ScopedRange::ScopedRange(const char* name, int64_t payload, Category category)
    : pushed_(nvtx_push(name, category, payload)) {}

ScopedRange::~ScopedRange() {
  if (pushed_) nvtx_pop();
}

}  // namespace ulysses::profile
