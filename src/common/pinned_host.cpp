// Page-locked host tensors of their exact size (see pinned_host.h).
#include "common/pinned_host.h"

#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <new>
#include <sstream>

#ifdef ULYSSES_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace ulysses {
namespace {

std::atomic<int64_t> g_bytes_left_pageable{0};
std::atomic<bool> g_fallback_reported{false};

// The soft locked-memory limit in bytes; -1 when unlimited or unknown.
int64_t locked_memory_limit() {
  struct rlimit limit {};
  if (getrlimit(RLIMIT_MEMLOCK, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return -1;
  return static_cast<int64_t>(limit.rlim_cur);
}

[[maybe_unused]] void note_pageable_fallback(int64_t bytes) {
  g_bytes_left_pageable += bytes;
  if (!g_fallback_reported.exchange(true)) {
    std::cerr << describe_pageable_fallback(bytes, locked_memory_limit()) << std::endl;
  }
}

#ifdef ULYSSES_WITH_CUDA
void unlock_and_free(void* ptr) {
  cudaHostUnregister(ptr);
  free(ptr);
}

bool have_gpu() {
  int count = 0;
  const bool ok = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  if (!ok) cudaGetLastError();  // clears the sticky "no device" error
  return ok;
}
#endif

}  // namespace

at::Tensor zeros_on_host(at::IntArrayRef sizes, at::ScalarType dtype, bool pinned) {
  const at::TensorOptions options = at::TensorOptions(dtype).device(at::kCPU);
#ifdef ULYSSES_WITH_CUDA
  int64_t numel = 1;
  for (int64_t s : sizes) numel *= s;
  const size_t bytes = static_cast<size_t>(numel) * c10::elementSize(dtype);
  if (pinned && bytes > 0 && have_gpu()) {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t rounded = (bytes + page - 1) / page * page;
    void* ptr = nullptr;
    if (posix_memalign(&ptr, page, rounded) != 0) throw std::bad_alloc();
    std::memset(ptr, 0, rounded);
    if (cudaHostRegister(ptr, rounded, cudaHostRegisterDefault) == cudaSuccess) {
      return at::from_blob(ptr, sizes, unlock_and_free, options);
    }
    cudaGetLastError();  // refused (e.g. RLIMIT_MEMLOCK): pageable instead, and said so once
    note_pageable_fallback(static_cast<int64_t>(rounded));
    return at::from_blob(ptr, sizes, free, options);
  }
#else
  (void)pinned;
#endif
  return at::zeros(sizes, options);
}

int64_t host_bytes_left_pageable() { return g_bytes_left_pageable.load(); }

std::string describe_pageable_fallback(int64_t bytes, int64_t limit_bytes) {
  std::ostringstream out;
  char size[32];
  std::snprintf(size, sizeof(size), "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  out << "ulysses: warning: the driver refused to page-lock " << size << " of host memory ("
      << "locked-memory limit " << (limit_bytes < 0 ? std::string("unlimited")
                                                     : std::to_string(limit_bytes / 1024) + " KiB")
      << ", ulimit -l): such buffers stay pageable, so their copies to and from the GPU are "
         "synchronous (further refusals are not reported)";
  return out.str();
}

bool is_page_locked(const at::Tensor& t) {
#ifdef ULYSSES_WITH_CUDA
  if (!t.is_cpu() || t.data_ptr() == nullptr || !have_gpu()) return false;
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, t.data_ptr()) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return attributes.type == cudaMemoryTypeHost;
#else
  (void)t;
  return false;
#endif
}

}  // namespace ulysses
