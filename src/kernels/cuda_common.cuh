// Device helpers the fused kernels share: vector loads and stores of 16 bytes, fp32 conversion
// with the dtype's rounding (round to nearest even, as ATen's casts), warp and block sums in a
// fixed order (deterministic), and the grid size that fills the device.
#pragma once
#include <c10/cuda/CUDAException.h>
#include <c10/core/ScalarType.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/util/Exception.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>

namespace ulysses::kernels::cuda {

// kVec elements of T in one aligned load or store (16 bytes when kVec = 16 / sizeof(T)).
template <typename T, int kVec>
struct alignas(sizeof(T) * kVec) Pack {
  T value[kVec];
};

template <typename T, int kVec>
__device__ __forceinline__ void load(const T* p, float (&out)[kVec]) {
  const Pack<T, kVec> pack = *reinterpret_cast<const Pack<T, kVec>*>(p);
#pragma unroll
  for (int i = 0; i < kVec; ++i) out[i] = static_cast<float>(pack.value[i]);
}

template <typename T, int kVec>
__device__ __forceinline__ void store(T* p, const float (&in)[kVec]) {
  Pack<T, kVec> pack;
#pragma unroll
  for (int i = 0; i < kVec; ++i) pack.value[i] = static_cast<T>(in[i]);
  *reinterpret_cast<Pack<T, kVec>*>(p) = pack;
}

// v rounded to T and back: what an ATen op that writes T stores.
template <typename T>
__device__ __forceinline__ float round_to(float v) {
  return static_cast<float>(static_cast<T>(v));
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// The sum of v over the block (blockDim.x a multiple of 32, at most 1024), the same on every
// thread. `scratch` [33] in shared memory; every thread of the block must call it.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float total = lane < static_cast<int>(blockDim.x >> 5) ? scratch[lane] : 0.0f;
    total = warp_sum(total);
    if (lane == 0) scratch[32] = total;
  }
  __syncthreads();
  const float total = scratch[32];
  __syncthreads();  // scratch is free for the next call
  return total;
}

// Calls fn(T{}) for the kernels' dtypes (bf16, fp16, fp32: T = c10::BFloat16, c10::Half, float);
// the *_fusable predicates admit no other.
template <typename Fn>
void dispatch_dtype(at::ScalarType dtype, const char* what, Fn&& fn) {
  switch (dtype) {
    case at::kBFloat16: return fn(c10::BFloat16{});
    case at::kHalf: return fn(c10::Half{});
    case at::kFloat: return fn(float{});
    default: TORCH_CHECK(false, what, ": no kernel for ", dtype);
  }
}

// Blocks of `threads` that fill the current device at the kernel's occupancy, at most `work`
// (at least 1). The occupancy is asked once per kernel, block size and device (a cache).
template <typename Kernel>
int64_t resident_blocks(Kernel kernel, int threads, int64_t work) {
  static std::mutex mutex;
  static std::map<std::tuple<const void*, int, int>, int64_t> cache;  // -> blocks per device
  const int device = c10::cuda::current_device();
  const auto key = std::make_tuple(reinterpret_cast<const void*>(kernel), threads, device);
  int64_t full = 0;
  {
    const std::lock_guard<std::mutex> lock(mutex);
    const auto found = cache.find(key);
    if (found != cache.end()) full = found->second;
  }
  if (full == 0) {
    int per_sm = 0, sms = 0;
    C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0));
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    full = int64_t{std::max(per_sm, 1)} * sms;
    const std::lock_guard<std::mutex> lock(mutex);
    cache[key] = full;
  }
  return std::max<int64_t>(1, std::min(work, full));
}

}  // namespace ulysses::kernels::cuda
