// NVTX3 ranges in domain "ulysses": registered strings, the categories of category.h
// (named comm / compute / offload / optimizer, with one color each) and an integer payload.
//
// Compiled in only where ULYSSES_HAS_NVTX is defined (CMake defines it for src/profile when the
// NVTX3 headers are found); otherwise NvtxRange is an empty class and every call compiles to
// nothing. The two variants live in different inline namespaces, so translation units built
// with and without the define can share one program. Code outside src/profile uses the
// macro-free ScopedPhase / ScopedRange of phase_timer.h instead of this header.
//
// Without a tool attached (nsys, Nsight), each NVTX call is a no-op function call.
#pragma once
#include <cstdint>

#include "profile/category.h"

#if defined(ULYSSES_HAS_NVTX)
#include <atomic>
#include <mutex>
#include <nvtx3/nvtx3.hpp>
#include <string>
#include <unordered_map>
#endif

namespace ulysses::profile {

#if defined(ULYSSES_HAS_NVTX)
inline namespace nvtx_on {

inline constexpr bool kNvtxCompiled = true;

// The NVTX domain every range of this project is in.
struct UlyssesDomain {
  static constexpr const char* name{"ulysses"};
};

// Runtime switch (profile.nvtx in the run config); on by default.
inline std::atomic<bool>& nvtx_switch() {
  static std::atomic<bool> enabled{true};
  return enabled;
}
inline void set_nvtx_enabled(bool enabled) { nvtx_switch().store(enabled); }
inline bool nvtx_enabled() { return nvtx_switch().load(std::memory_order_relaxed); }

// Names the four categories in the domain, once per process.
inline void name_nvtx_categories() {
  static const bool named = [] {
    for (Category c : kAllCategories)
      nvtx3::named_category_in<UlyssesDomain>(static_cast<uint32_t>(c), category_name(c));
    return true;
  }();
  (void)named;
}

// The handle of `text` registered in the domain; registers each distinct text once.
// Thread-safe.
inline nvtxStringHandle_t registered_string(const char* text) {
  static std::mutex mutex;
  static std::unordered_map<std::string, nvtx3::registered_string_in<UlyssesDomain>> handles;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = handles.find(text);
  if (it == handles.end())
    it = handles.emplace(text, nvtx3::registered_string_in<UlyssesDomain>{text}).first;
  return it->second.get_handle();
}

inline nvtx3::rgb category_color(Category category) {
  switch (category) {
    case Category::kCompute:
      return nvtx3::rgb{0x4c, 0xaf, 0x50};  // green
    case Category::kComm:
      return nvtx3::rgb{0xe5, 0x39, 0x35};  // red
    case Category::kOffload:
      return nvtx3::rgb{0x1e, 0x88, 0xe5};  // blue
    case Category::kOptimizer:
      return nvtx3::rgb{0xfb, 0x8c, 0x00};  // orange
    case Category::kNone:
      break;
  }
  return nvtx3::rgb{0x9e, 0x9e, 0x9e};  // grey
}

// Pushes a range named `name` on the calling thread; `payload` >= 0 is attached as an int64
// (step number, layer index). Returns false, doing nothing, while NVTX is switched off.
inline bool nvtx_push(const char* name, Category category, int64_t payload) {
  if (!nvtx_enabled()) return false;
  name_nvtx_categories();
  const nvtx3::message message{registered_string(name)};
  const nvtx3::category nvtx_category{static_cast<uint32_t>(category)};
  if (payload >= 0) {
    const nvtx3::event_attributes attributes{
        message, nvtx_category, nvtx3::color{category_color(category)}, nvtx3::payload{payload}};
    nvtxDomainRangePushEx(nvtx3::domain::get<UlyssesDomain>(), attributes.get());
  } else {
    const nvtx3::event_attributes attributes{message, nvtx_category,
                                             nvtx3::color{category_color(category)}};
    nvtxDomainRangePushEx(nvtx3::domain::get<UlyssesDomain>(), attributes.get());
  }
  return true;
}

// Pops the calling thread's innermost range of the domain. REQUIRES: a matching nvtx_push.
inline void nvtx_pop() { nvtxDomainRangePop(nvtx3::domain::get<UlyssesDomain>()); }

// A range open for the object's lifetime (nvtx_push / nvtx_pop).
// REQUIRES: constructed and destroyed on the same thread.
class NvtxRange {
 public:
  explicit NvtxRange(const char* name, Category category = Category::kNone, int64_t payload = -1)
      : pushed_(nvtx_push(name, category, payload)) {}
  ~NvtxRange() {
    if (pushed_) nvtx_pop();
  }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;

 private:
  bool pushed_;
};

}  // namespace nvtx_on
#else
inline namespace nvtx_off {

inline constexpr bool kNvtxCompiled = false;
inline void set_nvtx_enabled(bool) {}
inline bool nvtx_enabled() { return false; }
inline bool nvtx_push(const char*, Category, int64_t) { return false; }
inline void nvtx_pop() {}

// NVTX is not compiled in: an empty object.
class NvtxRange {
 public:
  explicit NvtxRange(const char*, Category = Category::kNone, int64_t = -1) {}
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

}  // namespace nvtx_off
#endif

}  // namespace ulysses::profile
