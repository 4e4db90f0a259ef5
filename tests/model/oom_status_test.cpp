// Out of memory inside attention keeps its exit status: an allocation failure
// injected while a forced SDPA kernel runs must reach run_with_exit_status as out of memory (12),
// not as the "attention.backend: ... cannot run these inputs" user error (2).
#include <gtest/gtest.h>

#include <c10/core/CPUAllocator.h>

#include <cstring>

#include "common/error.h"
#include "comm/exit_status.h"
#include "model/attention_core.h"

namespace ulysses::model {
namespace {

// Fails every allocation with the CUDA caching allocator's out-of-memory error.
class FailingAllocator : public at::Allocator {
 public:
  at::DataPtr allocate(size_t bytes) override {
    TORCH_CHECK_WITH(OutOfMemoryError, bytes == 0, "CUDA out of memory. Tried to allocate ",
                     bytes, " bytes (injected by the test)");
    return {nullptr, nullptr, &noop, at::Device(at::kCPU)};
  }
  at::DeleterFnPtr raw_deleter() const override { return &noop; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }

 private:
  static void noop(void*) {}
};

// Installs the failing allocator for its lifetime (higher priorities win; restoring needs a
// higher one again).
class InjectOutOfMemory {
 public:
  InjectOutOfMemory() : previous_(c10::GetCPUAllocator()) { c10::SetCPUAllocator(&failing_, 100); }
  ~InjectOutOfMemory() { c10::SetCPUAllocator(previous_, 101); }

 private:
  FailingAllocator failing_;
  at::Allocator* previous_;
};

TEST(OutOfMemoryStatus, ForcedSdpaKernelKeepsOutOfMemory) {
  at::Tensor q = at::randn({1, 64, 4, 16}), k = at::randn({1, 64, 2, 16}),
             v = at::randn({1, 64, 2, 16});
  std::string stderr_text;
  int status = 0;
  {
    ::testing::internal::CaptureStderr();
    InjectOutOfMemory inject;
    status = comm::run_with_exit_status([&] {
      local_attention(q, k, v, at::Tensor(), AttentionBackend::kFlash);
      return 0;
    });
  }
  stderr_text = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(status, kExitOutOfMemory) << stderr_text;
  EXPECT_EQ(stderr_text.rfind("out of memory: ", 0), 0u) << stderr_text;
}

}  // namespace
}  // namespace ulysses::model
