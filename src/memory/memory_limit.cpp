// memory.limit_gib: RLIMIT_AS above the baseline on CPU, allocator fraction on CUDA (see header).
#include "memory/memory_limit.h"

#include <malloc.h>

#include <ATen/Parallel.h>
#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>

#include "common/error.h"
#include "memory/memory_stats.h"

#ifdef ULYSSES_WITH_CUDA
#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#endif

namespace ulysses::memory {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string gib(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f GiB", static_cast<double>(bytes) / kGiB);
  return text;
}

// Starts the intra-op pool and lets every worker allocate once, so that thread stacks and malloc
// arenas are reserved before the baseline is measured.
void reserve_thread_pool() {
  const int64_t threads = at::get_num_threads();
  at::parallel_for(0, threads, 1, [](int64_t, int64_t) { std::free(std::malloc(64)); });
}

}  // namespace

bool fix_host_mmap_threshold(int64_t bytes) {
  if (std::getenv("MALLOC_MMAP_THRESHOLD_") != nullptr) return false;
  return mallopt(M_MMAP_THRESHOLD, static_cast<int>(bytes)) == 1;
}

namespace {

MemoryLimit apply_host_limit(int64_t limit_bytes) {
  reserve_thread_pool();
  // Threads started after the baseline (Gloo's, on a collective's first use) would each reserve
  // a 64 MiB malloc arena of address space and hit the cap without using memory: make them share
  // the arenas that exist (glibc).
  mallopt(M_ARENA_MAX, 1);
  MemoryLimit out;
  out.limit_bytes = limit_bytes;
  out.baseline_bytes = virtual_memory_bytes();
  out.cap_bytes = out.baseline_bytes + limit_bytes;
  struct rlimit current {};
  getrlimit(RLIMIT_AS, &current);
  if (current.rlim_max != RLIM_INFINITY && static_cast<rlim_t>(out.cap_bytes) > current.rlim_max) {
    throw UserError("memory.limit_gib: baseline " + gib(out.baseline_bytes) + " + limit " +
                    gib(limit_bytes) + " exceeds the hard address-space limit " +
                    gib(static_cast<int64_t>(current.rlim_max)));
  }
  struct rlimit wanted = current;
  wanted.rlim_cur = static_cast<rlim_t>(out.cap_bytes);
  if (setrlimit(RLIMIT_AS, &wanted) != 0) {
    throw UserError("memory.limit_gib: setrlimit(RLIMIT_AS) failed");
  }
  return out;
}

#ifdef ULYSSES_WITH_CUDA
MemoryLimit apply_device_limit(int64_t limit_bytes, const c10::Device& device) {
  c10::cuda::CUDAGuard guard(device);
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess || total_bytes == 0) {
    throw UserError("memory.limit_gib: cannot query the memory of " + device.str());
  }
  if (limit_bytes > static_cast<int64_t>(total_bytes)) {
    throw UserError("memory.limit_gib: " + gib(limit_bytes) + " is more than " + device.str() +
                    " has (" + gib(static_cast<int64_t>(total_bytes)) + ")");
  }
  // The caching allocator exists per device only after LibTorch's lazy CUDA init, which the
  // first CUDA tensor triggers; before it (a 1-rank job has allocated nothing yet),
  // setMemoryFraction fails "Allocator not initialized ... did you call init?". An empty tensor
  // runs that init on every LibTorch 2.x (lazyInitCUDA / lazyInitDevice differ by release).
  (void)at::empty({0}, at::TensorOptions().device(device));
  c10::cuda::CUDACachingAllocator::setMemoryFraction(
      static_cast<double>(limit_bytes) / static_cast<double>(total_bytes), device.index());
  MemoryLimit out;
  out.limit_bytes = limit_bytes;
  out.cap_bytes = limit_bytes;
  out.on_device = true;
  return out;
}
#endif

}  // namespace

std::string MemoryLimit::describe() const {
  if (limit_bytes == 0) return "no memory limit";
  if (on_device) return "memory limit " + gib(limit_bytes) + ": CUDA caching allocator cap";
  return "memory limit " + gib(limit_bytes) + ": RLIMIT_AS " + gib(cap_bytes) + " = baseline " +
         gib(baseline_bytes) + " + limit";
}

MemoryLimit apply_memory_limit(double limit_gib, const c10::Device& device) {
  if (!(limit_gib >= 0.0)) {
    throw UserError("memory.limit_gib: must be >= 0, got " + std::to_string(limit_gib));
  }
  const auto limit_bytes = static_cast<int64_t>(limit_gib * kGiB);
  MemoryLimit out;
#ifdef ULYSSES_WITH_CUDA
  if (limit_bytes > 0 && device.is_cuda()) out = apply_device_limit(limit_bytes, device);
#endif
  if (limit_bytes > 0 && !device.is_cuda()) out = apply_host_limit(limit_bytes);
  record_startup_baseline(device);  // what summary.json's peak counts from (memory_stats.h)
  return out;
}

}  // namespace ulysses::memory
