// Page-locked host tensors: zeros_on_host's result, and the one-line warning when the driver
// refuses to lock pages (which only a CUDA machine can refuse; its text is checked here).
#include <gtest/gtest.h>

#include <string>

#include "common/pinned_host.h"

namespace ulysses {
namespace {

TEST(PinnedHost, ZerosOnHostIsZeroedAndNothingIsLeftPageableWithoutAGpu) {
  const at::Tensor t = zeros_on_host({3, 5}, at::kFloat, /*pinned=*/true);  // [3, 5]
  EXPECT_TRUE(t.is_cpu());
  EXPECT_EQ(t.abs().sum().item<float>(), 0.0f);
  if (!at::hasCUDA()) {
    EXPECT_EQ(host_bytes_left_pageable(), 0) << "no GPU: pageable is what was asked for";
  }
}

TEST(PinnedHost, PageableFallbackWarningNamesTheSizeAndTheLimit) {
  const std::string limited = describe_pageable_fallback(int64_t{3} << 20, int64_t{64} << 10);
  EXPECT_NE(limited.find("3.0 MiB"), std::string::npos) << limited;
  EXPECT_NE(limited.find("locked-memory limit 64 KiB"), std::string::npos) << limited;
  EXPECT_NE(limited.find("synchronous"), std::string::npos) << limited;
  EXPECT_EQ(limited.find('\n'), std::string::npos) << "one line";
  const std::string unlimited = describe_pageable_fallback(int64_t{1} << 30, -1);
  EXPECT_NE(unlimited.find("1024.0 MiB"), std::string::npos) << unlimited;
  EXPECT_NE(unlimited.find("locked-memory limit unlimited"), std::string::npos) << unlimited;
}

}  // namespace
}  // namespace ulysses
