// Phase and category accounting of profile::ScopedPhase: nested scopes give inclusive phases
// and exclusive categories that add up to the top-level scopes, across threads too. The checks
// are identities of the bookkeeping (they hold for any durations), never timing thresholds.
#include "profile/phase_timer.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "profile/category.h"

namespace ulysses {
namespace {

using profile::Category;
using profile::ScopedPhase;

constexpr double kTol = 1e-9;  // ms; sums of the same doubles in another order

// Busy work so that every scope has a positive duration.
void work() {
  volatile double sink = 0.0;
  for (int i = 0; i < 20000; ++i) sink = sink + i * 1e-9;
}

TEST(Category, DefaultsByPhaseName) {
  EXPECT_EQ(profile::default_category("a2a"), Category::kComm);
  EXPECT_EQ(profile::default_category("grad_sync"), Category::kComm);
  EXPECT_EQ(profile::default_category("optimizer"), Category::kOptimizer);
  EXPECT_EQ(profile::default_category("offload"), Category::kOffload);
  EXPECT_EQ(profile::default_category("offload_prefetch"), Category::kOffload);
  EXPECT_EQ(profile::default_category("attention"), Category::kCompute);
  EXPECT_EQ(profile::default_category("mlp"), Category::kCompute);
  EXPECT_STREQ(profile::category_name(Category::kComm), "comm");
}

TEST(PhaseTimer, NestedScopesSplitIntoExclusiveCategories) {
  profile::take_step_times();
  {
    ScopedPhase forward("forward");
    work();
    {
      ScopedPhase a2a("a2a");
      work();
    }
    {
      ScopedPhase attention("attention");
      work();
      ScopedPhase inner("a2a");  // comm nested in compute nested in compute
      work();
    }
  }
  {
    ScopedPhase sync("grad_sync");
    work();
  }
  {
    ScopedPhase optimizer("optimizer");
    work();
  }
  const profile::StepTimes t = profile::take_step_times();
  const auto& p = t.phases;
  ASSERT_EQ(p.size(), 5u);
  for (const auto& [name, ms] : p) EXPECT_GT(ms, 0.0) << name;
  // Inclusive: a scope contains its children.
  EXPECT_GT(p.at("forward"), p.at("attention"));
  EXPECT_GT(p.at("forward"), p.at("a2a"));
  // Exclusive: categories add up to the top-level scopes, comm is every a2a + grad_sync,
  // compute is forward minus the comm inside it.
  EXPECT_NEAR(t.categorized_ms(), p.at("forward") + p.at("grad_sync") + p.at("optimizer"), kTol);
  EXPECT_NEAR(t.comm_ms, p.at("a2a") + p.at("grad_sync"), kTol);
  EXPECT_NEAR(t.compute_ms, p.at("forward") - p.at("a2a"), kTol);
  EXPECT_DOUBLE_EQ(t.optimizer_ms, p.at("optimizer"));
  EXPECT_EQ(t.offload_ms, 0.0);
  EXPECT_EQ(t.comm_wait_ms, t.comm_ms);  // blocking collectives: the stream waits on all comm
}

TEST(PhaseTimer, TakeResets) {
  {
    ScopedPhase phase("loss");
    work();
  }
  EXPECT_FALSE(profile::take_step_times().phases.empty());
  const profile::StepTimes empty = profile::take_step_times();
  EXPECT_TRUE(empty.phases.empty());
  EXPECT_EQ(empty.categorized_ms(), 0.0);
}

TEST(PhaseTimer, UncategorizedScopesAreTransparent) {
  profile::take_step_times();
  {
    ScopedPhase backward("backward");
    work();
    ScopedPhase wrapper("layer_total", Category::kNone);
    work();
    ScopedPhase a2a("a2a");
    work();
  }
  const profile::StepTimes t = profile::take_step_times();
  EXPECT_GT(t.phases.at("layer_total"), 0.0);
  EXPECT_NEAR(t.categorized_ms(), t.phases.at("backward"), kTol);
  EXPECT_NEAR(t.compute_ms, t.phases.at("backward") - t.phases.at("a2a"), kTol);
}

// Autograd runs backward functions (e.g. the all-to-all's) on its own threads while the caller
// waits inside backward(): their scopes nest in the caller's.
TEST(PhaseTimer, ScopesOnAnotherThreadNestInTheOpenScope) {
  profile::take_step_times();
  {
    ScopedPhase backward("backward");
    work();
    std::thread worker([] {
      ScopedPhase a2a("a2a");
      work();
    });
    worker.join();
  }
  const profile::StepTimes t = profile::take_step_times();
  EXPECT_NEAR(t.compute_ms, t.phases.at("backward") - t.phases.at("a2a"), kTol);
  EXPECT_NEAR(t.comm_ms, t.phases.at("a2a"), kTol);
}

// An offload copy on a side stream runs beside the compute scope it was issued from: its time is
// offload, and the enclosing compute keeps all of its own (the old code took it out, and timed
// the copy on the compute stream, where it took no time at all).
TEST(PhaseTimer, OverlappedScopeDoesNotShrinkItsParent) {
  profile::take_step_times();
  {
    ScopedPhase forward("forward");
    work();
    {
      ScopedPhase offload("offload", profile::kOverlapped);
      work();
      ScopedPhase a2a("a2a");  // nests in forward, not in the overlapped scope
      work();
    }
  }
  const profile::StepTimes t = profile::take_step_times();
  EXPECT_GT(t.offload_ms, 0.0);
  EXPECT_DOUBLE_EQ(t.offload_ms, t.phases.at("offload"));
  EXPECT_NEAR(t.compute_ms, t.phases.at("forward") - t.phases.at("a2a"), kTol);
  EXPECT_NEAR(t.comm_ms, t.phases.at("a2a"), kTol);
}

TEST(PhaseTimer, AddPhaseTimeCountsAsTopLevel) {
  profile::take_step_times();
  profile::add_phase_time("grad_sync", 2.5);
  profile::add_phase_time("mlp", 1.0);
  const profile::StepTimes t = profile::take_step_times();
  EXPECT_DOUBLE_EQ(t.comm_ms, 2.5);
  EXPECT_DOUBLE_EQ(t.compute_ms, 1.0);
  EXPECT_EQ(profile::take_phase_times().size(), 0u);
}

}  // namespace
}  // namespace ulysses
