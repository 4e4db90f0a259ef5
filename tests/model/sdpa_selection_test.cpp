// SDP kernel selection: auto never allows SDPA's [sl, sl] math kernel on CUDA (it does on CPU, as
// before); the switches a call needs stay set instead of being flipped back after every call; the
// kernel SDPA chose is recorded for summary.json.
#include <gtest/gtest.h>

#include <ATen/Context.h>

#include <algorithm>

#include "model/attention_core.h"
#include "model/sdpa_attention.h"

namespace ulysses::model {
namespace {

SdpKernels current_switches() {
  const auto& ctx = at::globalContext();
  SdpKernels k;
  k.flash = ctx.userEnabledFlashSDP();
  k.efficient = ctx.userEnabledMemEfficientSDP();
  k.math = ctx.userEnabledMathSDP();
#if ULYSSES_HAS_CUDNN_SDPA
  k.cudnn = ctx.userEnabledCuDNNSDP();
#endif
  return k;
}

bool recorded(const std::string& kernel) {
  const std::vector<std::string> used = attention_kernels_used();
  return std::find(used.begin(), used.end(), kernel) != used.end();
}

TEST(SdpSelection, AutoExcludesTheMathKernelOnCudaOnly) {
  const SdpKernels cuda_auto = sdp_kernels_for(AttentionBackend::kSdpaAuto, /*cuda=*/true);
  EXPECT_TRUE(cuda_auto.flash && cuda_auto.efficient && cuda_auto.cudnn);
  EXPECT_FALSE(cuda_auto.math);
  const SdpKernels cpu_auto = sdp_kernels_for(AttentionBackend::kSdpaAuto, /*cuda=*/false);
  EXPECT_TRUE(cpu_auto.flash && cpu_auto.efficient && cpu_auto.cudnn && cpu_auto.math);
  SdpKernels flash_only;
  flash_only.flash = true;
  EXPECT_EQ(sdp_kernels_for(AttentionBackend::kFlash, true), flash_only);
  EXPECT_EQ(sdp_kernels_for(AttentionBackend::kFlash, false), flash_only);
  SdpKernels efficient_only;
  efficient_only.efficient = true;
  EXPECT_EQ(sdp_kernels_for(AttentionBackend::kEfficient, true), efficient_only);
}

TEST(SdpSelection, SwitchesStaySetForTheNextCallAndTheKernelIsRecorded) {
  at::manual_seed(4);
  const at::Tensor q = at::randn({1, 16, 4, 8}), k = at::randn({1, 16, 2, 8}),
                   v = at::randn({1, 16, 2, 8});
  const at::Tensor flash_out = sdpa_attention(q, k, v, at::Tensor(), AttentionBackend::kFlash);
  EXPECT_EQ(current_switches(), sdp_kernels_for(AttentionBackend::kFlash, false));
  const at::Tensor auto_out = sdpa_attention(q, k, v, at::Tensor(), AttentionBackend::kSdpaAuto);
  EXPECT_EQ(current_switches(), sdp_kernels_for(AttentionBackend::kSdpaAuto, false));
  // The CPU flash kernel takes these inputs under either selection: the same result.
  EXPECT_TRUE(at::equal(auto_out, flash_out));
  EXPECT_TRUE(recorded("flash"));
  local_attention(q, k, v, at::Tensor(), AttentionBackend::kMath);
  EXPECT_TRUE(recorded("math"));
}

}  // namespace
}  // namespace ulysses::model
