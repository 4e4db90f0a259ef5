// Page-locked host tensors of their exact size (see pinned_host.h).
#include "common/pinned_host.h"

#include <stdlib.h>
#include <unistd.h>

#include <cstring>
#include <new>

#ifdef ULYSSES_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace ulysses {
namespace {

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
    cudaGetLastError();  // refused (e.g. RLIMIT_MEMLOCK): pageable instead
    return at::from_blob(ptr, sizes, free, options);
  }
#else
  (void)pinned;
#endif
  return at::zeros(sizes, options);
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
