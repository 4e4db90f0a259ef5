// The NVTX build (ULYSSES_HAS_NVTX, NVTX3 headers found): ranges reach a tool in domain
// "ulysses" with registered strings, the four named categories and payloads, pushes and pops
// balance, and profile.nvtx: false silences them. A static NVTX injection (nvtx_recorder.h)
// plays the tool.
#include <gtest/gtest.h>

#include "nvtx_recorder.h"
#include "profile/nvtx.h"
#include "profile/phase_timer.h"

namespace ulysses {
namespace {

using testing::nvtx_record;
using testing::pushes_named;

static_assert(profile::kNvtxCompiled, "this test must be built with ULYSSES_HAS_NVTX");

TEST(NvtxOn, LibraryAndThisTranslationUnitHaveNvtx) {
  EXPECT_TRUE(profile::nvtx_compiled_in());
  EXPECT_TRUE(profile::kNvtxCompiled);
  EXPECT_FALSE(std::is_empty_v<profile::NvtxRange>);
}

TEST(NvtxOn, ScopedPhaseIsARegisteredRangeWithItsCategory) {
  { profile::ScopedPhase a2a("a2a"); }
  { profile::ScopedPhase attention("attention"); }
  { profile::ScopedPhase optimizer("optimizer"); }
  { profile::ScopedPhase copy("offload", profile::Category::kOffload); }
  ASSERT_TRUE(nvtx_record().initialized);
  const auto a2a = pushes_named("ulysses", "a2a");
  ASSERT_EQ(a2a.size(), 1u);
  EXPECT_TRUE(a2a[0].registered);
  EXPECT_EQ(a2a[0].category, static_cast<uint32_t>(profile::Category::kComm));
  EXPECT_FALSE(a2a[0].has_int64_payload);
  EXPECT_EQ(pushes_named("ulysses", "attention").at(0).category,
            static_cast<uint32_t>(profile::Category::kCompute));
  EXPECT_EQ(pushes_named("ulysses", "optimizer").at(0).category,
            static_cast<uint32_t>(profile::Category::kOptimizer));
  EXPECT_EQ(pushes_named("ulysses", "offload").at(0).category,
            static_cast<uint32_t>(profile::Category::kOffload));
  profile::take_step_times();
}

TEST(NvtxOn, CategoriesAreNamedInTheDomain) {
  { profile::ScopedPhase any("forward"); }
  std::lock_guard<std::mutex> lock(nvtx_record().mutex);
  const auto& names = nvtx_record().categories;
  EXPECT_EQ(names.at({"ulysses", 1}), "compute");
  EXPECT_EQ(names.at({"ulysses", 2}), "comm");
  EXPECT_EQ(names.at({"ulysses", 3}), "offload");
  EXPECT_EQ(names.at({"ulysses", 4}), "optimizer");
  profile::take_step_times();
}

TEST(NvtxOn, EachTextIsRegisteredOnceInTheDomain) {
  for (int i = 0; i < 3; ++i) {
    profile::ScopedPhase phase("backward");
    profile::NvtxRange range("backward", profile::Category::kCompute);
  }
  std::lock_guard<std::mutex> lock(nvtx_record().mutex);
  int registrations = 0;
  for (size_t i = 0; i < nvtx_record().strings.size(); ++i) {
    if (nvtx_record().strings[i] == "backward") {
      ++registrations;
      EXPECT_EQ(nvtx_record().string_domains[i], "ulysses");
    }
  }
  EXPECT_EQ(registrations, 1);
  int domains = 0;
  for (const auto& d : nvtx_record().domains) domains += d == "ulysses";
  EXPECT_EQ(domains, 1);
  profile::take_step_times();
}

TEST(NvtxOn, StepRangeCarriesTheStepNumberAndPushesBalancePops) {
  {
    profile::ScopedRange step("step", 7);
    profile::ScopedRange layer("layer", 0);
  }
  const auto steps = pushes_named("ulysses", "step");
  ASSERT_EQ(steps.size(), 1u);
  EXPECT_TRUE(steps[0].has_int64_payload);
  EXPECT_EQ(steps[0].payload, 7);
  EXPECT_EQ(steps[0].category, 0u);
  EXPECT_EQ(pushes_named("ulysses", "layer").at(0).payload, 0);
  std::lock_guard<std::mutex> lock(nvtx_record().mutex);
  int64_t pushes = 0;
  for (const auto& p : nvtx_record().pushes) pushes += p.domain == "ulysses";
  EXPECT_EQ(nvtx_record().pops["ulysses"], pushes);
}

TEST(NvtxOn, SwitchedOffEmitsNothingButStillTimes) {
  profile::take_step_times();
  size_t before = 0;
  {
    std::lock_guard<std::mutex> lock(nvtx_record().mutex);
    before = nvtx_record().pushes.size();
  }
  profile::enable_nvtx(false);
  {
    profile::ScopedPhase phase("loss");
    profile::ScopedRange step("step", 1);
  }
  profile::enable_nvtx(true);
  {
    std::lock_guard<std::mutex> lock(nvtx_record().mutex);
    EXPECT_EQ(nvtx_record().pushes.size(), before);
  }
  EXPECT_EQ(profile::take_step_times().phases.count("loss"), 1u);
}

}  // namespace
}  // namespace ulysses
