// The build without NVTX headers: this translation unit and the profile library it links
// (tests/profile/CMakeLists.txt builds one from the same sources without ULYSSES_HAS_NVTX) have
// no NVTX at all: NvtxRange is an empty class, pushes are refused, and scopes still time.
#include <gtest/gtest.h>

#include <type_traits>

#include "profile/nvtx.h"
#include "profile/phase_timer.h"

namespace ulysses {
namespace {

static_assert(!profile::kNvtxCompiled, "this test must be built without ULYSSES_HAS_NVTX");
static_assert(std::is_empty_v<profile::NvtxRange>, "without NVTX a range holds nothing");

TEST(NvtxOff, NothingIsCompiledIn) {
  EXPECT_FALSE(profile::nvtx_compiled_in());
  EXPECT_FALSE(profile::nvtx_enabled());
  EXPECT_FALSE(profile::nvtx_push("a2a", profile::Category::kComm, -1));
  profile::NvtxRange range("a2a", profile::Category::kComm);  // compiles, does nothing
  profile::enable_nvtx(true);                                 // no effect
  EXPECT_FALSE(profile::nvtx_enabled());
}

TEST(NvtxOff, ScopesStillTime) {
  profile::take_step_times();
  {
    profile::ScopedRange step("step", 1);
    profile::ScopedPhase forward("forward");
    profile::ScopedPhase a2a("a2a");
  }
  const profile::StepTimes t = profile::take_step_times();
  EXPECT_EQ(t.phases.count("forward"), 1u);
  EXPECT_EQ(t.phases.count("a2a"), 1u);
  EXPECT_EQ(t.phases.count("step"), 0u);  // ranges are not timed
  EXPECT_DOUBLE_EQ(t.comm_ms, t.phases.at("a2a"));
}

}  // namespace
}  // namespace ulysses
