// Fused RMSNorm forward and backward (see rms_norm.h). The ATen path it replaces is beside it:
// RmsNormFunction in rms_norm.cpp. A block takes whole rows (grid-stride over the rows),
// each thread a fixed set of columns (RowPlan) held in registers: one read of x per pass, the
// weight read once per block, the row statistic by a block sum in a fixed order.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "kernels/cuda_common.cuh"
#include "kernels/rms_norm.h"
#include "kernels/tensor_checks.h"

namespace ulysses::kernels {
namespace {

using cuda::block_sum;
using cuda::load;
using cuda::round_to;
using cuda::store;

constexpr int kMaxThreads = 512;

// The column of thread threadIdx.x's it-th vector.
__device__ __forceinline__ int column(int it, int vec) {
  return (it * static_cast<int>(blockDim.x) + static_cast<int>(threadIdx.x)) * vec;
}

// Stores row[c + i] = value(it, i) for the thread's vectors of the row (it < kIters, i < kVec; the
// loops unroll, so register arrays that value reads are indexed by constants).
template <typename T, int kVec, int kIters, typename Value>
__device__ __forceinline__ void store_row(T* row, int h, const Value& value) {
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int c = column(it, kVec);
    if (c < h) {
      float out[kVec];
#pragma unroll
      for (int i = 0; i < kVec; ++i) out[i] = value(it, i);
      store<T, kVec>(row + c, out);
    }
  }
}

// y [rows, h] = round(weight * round(x * inv_rms)), inv_rms [rows] = rsqrt(mean(x^2) + eps).
template <typename T, int kVec, int kIters>
__global__ void __launch_bounds__(kMaxThreads)
    rms_norm_forward_kernel(const T* __restrict__ x, const T* __restrict__ weight,
                            T* __restrict__ y, float* __restrict__ inv_rms, int64_t rows, int h,
                            float eps) {
  __shared__ float scratch[33];
  float w[kIters][kVec];
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int c = column(it, kVec);
    if (c < h) load<T, kVec>(weight + c, w[it]);
  }
  const float inv_h = 1.0f / static_cast<float>(h);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* x_row = x + row * h;
    float v[kIters][kVec];
    float squares = 0.0f;
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int c = column(it, kVec);
      if (c < h) {
        load<T, kVec>(x_row + c, v[it]);
#pragma unroll
        for (int i = 0; i < kVec; ++i) squares += v[it][i] * v[it][i];
      }
    }
    const float r = rsqrtf(block_sum(squares, scratch) * inv_h + eps);
    if (threadIdx.x == 0) inv_rms[row] = r;
    store_row<T, kVec, kIters>(y + row * h, h, [&](int it, int i) {
      return w[it][i] * round_to<T>(v[it][i] * r);
    });
  }
}

// grad_x [rows, h] (when not null) and the block's weight-gradient sums partial [gridDim.x, h]
// fp32 (when not null), from grad_y, x [rows, h], weight [h], inv_rms [rows].
template <typename T, int kVec, int kIters>
__global__ void __launch_bounds__(kMaxThreads)
    rms_norm_backward_kernel(const T* __restrict__ grad_y, const T* __restrict__ x,
                             const T* __restrict__ weight, const float* __restrict__ inv_rms,
                             T* __restrict__ grad_x, float* __restrict__ partial, int64_t rows,
                             int h) {
  __shared__ float scratch[33];
  float w[kIters][kVec];
  float acc[kIters][kVec];
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int c = column(it, kVec);
#pragma unroll
    for (int i = 0; i < kVec; ++i) acc[it][i] = 0.0f;
    if (c < h) load<T, kVec>(weight + c, w[it]);
  }
  const float inv_h = 1.0f / static_cast<float>(h);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const float r = inv_rms[row];
    float v[kIters][kVec];  // x
    float g[kIters][kVec];  // round(grad_y * weight)
    float dot = 0.0f;       // sum(g * x)
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int c = column(it, kVec);
      if (c < h) {
        float dy[kVec];
        load<T, kVec>(x + row * h + c, v[it]);
        load<T, kVec>(grad_y + row * h + c, dy);
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
          g[it][i] = round_to<T>(dy[i] * w[it][i]);
          dot += g[it][i] * v[it][i];
          if (partial != nullptr) acc[it][i] += dy[i] * round_to<T>(v[it][i] * r);
        }
      }
    }
    if (grad_x == nullptr) continue;  // the same for the whole block
    const float scale = r * r * r * (block_sum(dot, scratch) * inv_h);
    store_row<T, kVec, kIters>(grad_x + row * h, h,
                               [&](int it, int i) { return r * g[it][i] - v[it][i] * scale; });
  }
  if (partial == nullptr) return;
  float* partial_row = partial + blockIdx.x * static_cast<int64_t>(h);
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int c = column(it, kVec);
    if (c < h) {
#pragma unroll
      for (int i = 0; i < kVec; ++i) partial_row[c + i] = acc[it][i];
    }
  }
}

// grad_weight [h] = the sum of partial [blocks, h] over the blocks, in block order.
template <typename T>
__global__ void sum_partials_kernel(const float* __restrict__ partial, T* __restrict__ grad_weight,
                                    int64_t blocks, int h) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= h) return;
  float total = 0.0f;
  for (int64_t b = 0; b < blocks; ++b) total += partial[b * h + c];
  grad_weight[c] = static_cast<T>(total);
}

// Calls fn(std::integral_constant<int, vec>, std::integral_constant<int, iters>) for the plan's
// vector width and iterations (the instantiations the plan can ask for: iters * vec <= 32).
template <typename T, typename Fn>
void with_plan(const RowPlan& plan, Fn&& fn) {
  constexpr int kFull = 16 / static_cast<int>(sizeof(T));
  using std::integral_constant;
  if (plan.vec == kFull) {
    switch (plan.iters) {
      case 1: return fn(integral_constant<int, kFull>{}, integral_constant<int, 1>{});
      case 2: return fn(integral_constant<int, kFull>{}, integral_constant<int, 2>{});
      case 4: return fn(integral_constant<int, kFull>{}, integral_constant<int, 4>{});
      case 8:
        if constexpr (kFull * 8 <= 32) {
          return fn(integral_constant<int, kFull>{}, integral_constant<int, 8>{});
        }
        break;
    }
  } else if (plan.vec == 1) {
    switch (plan.iters) {
      case 1: return fn(integral_constant<int, 1>{}, integral_constant<int, 1>{});
      case 2: return fn(integral_constant<int, 1>{}, integral_constant<int, 2>{});
      case 4: return fn(integral_constant<int, 1>{}, integral_constant<int, 4>{});
      case 8: return fn(integral_constant<int, 1>{}, integral_constant<int, 8>{});
    }
  }
  TORCH_CHECK(false, "rms_norm: no kernel for vec ", plan.vec, ", iters ", plan.iters);
}

// Calls fn(T{}, vec, iters) for x's dtype T and the plan (see with_plan).
template <typename Fn>
void with_dtype_and_plan(const at::Tensor& x, const RowPlan& plan, const char* what, Fn&& fn) {
  cuda::dispatch_dtype(x.scalar_type(), what, [&](auto tag) {
    with_plan<decltype(tag)>(plan, [&](auto vec, auto iters) { fn(tag, vec, iters); });
  });
}

}  // namespace

RmsNormOutput rms_norm_forward(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(rms_norm_fusable(x, weight), "rms_norm_forward: unsupported x ", x.sizes(), " ",
              x.scalar_type(), " / weight ", weight.sizes(), " ", weight.scalar_type());
  const c10::cuda::CUDAGuard guard(x.device());
  const int h = static_cast<int>(x.size(-1));
  const int64_t rows = x.numel() / h;
  const RowPlan plan = rms_norm_plan(x, weight);
  RmsNormOutput out{at::empty_like(x), at::empty({rows}, x.options().dtype(at::kFloat))};
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  with_dtype_and_plan(x, plan, "rms_norm_forward", [&](auto tag, auto vec, auto iters) {
    using T = decltype(tag);
    const auto kernel = rms_norm_forward_kernel<T, decltype(vec)::value, decltype(iters)::value>;
    const int64_t blocks = cuda::resident_blocks(kernel, plan.threads, rows);
    kernel<<<static_cast<unsigned>(blocks), plan.threads, 0, stream>>>(
        x.data_ptr<T>(), weight.data_ptr<T>(), out.y.data_ptr<T>(), out.inv_rms.data_ptr<float>(),
        rows, h, static_cast<float>(eps));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

RmsNormGrads rms_norm_backward(const at::Tensor& grad_y_in, const at::Tensor& x,
                               const at::Tensor& weight, const at::Tensor& inv_rms,
                               bool need_grad_x, bool need_grad_weight) {
  TORCH_CHECK(rms_norm_fusable(x, weight), "rms_norm_backward: unsupported x ", x.sizes(), " ",
              x.scalar_type(), " / weight ", weight.sizes(), " ", weight.scalar_type());
  TORCH_CHECK(grad_y_in.sizes() == x.sizes() && grad_y_in.scalar_type() == x.scalar_type() &&
                  grad_y_in.device() == x.device(),
              "rms_norm_backward: grad_y ", grad_y_in.sizes(), " ", grad_y_in.scalar_type(),
              " does not match x");
  const c10::cuda::CUDAGuard guard(x.device());
  const int h = static_cast<int>(x.size(-1));
  const int64_t rows = x.numel() / h;
  TORCH_CHECK(inv_rms.numel() == rows && inv_rms.scalar_type() == at::kFloat &&
                  inv_rms.is_contiguous(),
              "rms_norm_backward: inv_rms must be fp32 [", rows, "]");
  // The plan took x's and the weight's alignment; a gradient at an odd offset is copied.
  at::Tensor grad_y = grad_y_in.contiguous();
  if (!aligned16(grad_y)) grad_y = grad_y.clone();
  const RowPlan plan = rms_norm_plan(x, weight);
  RmsNormGrads grads;
  if (need_grad_x) grads.grad_x = at::empty_like(x);
  if (!need_grad_x && !need_grad_weight) return grads;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  with_dtype_and_plan(x, plan, "rms_norm_backward", [&](auto tag, auto vec, auto iters) {
    using T = decltype(tag);
    const auto kernel = rms_norm_backward_kernel<T, decltype(vec)::value, decltype(iters)::value>;
    const int64_t blocks = cuda::resident_blocks(kernel, plan.threads, rows);
    at::Tensor partial;  // [blocks, h] fp32
    if (need_grad_weight) partial = at::empty({blocks, h}, x.options().dtype(at::kFloat));
    T* grad_x = need_grad_x ? grads.grad_x.data_ptr<T>() : nullptr;
    float* partial_sums = need_grad_weight ? partial.data_ptr<float>() : nullptr;
    kernel<<<static_cast<unsigned>(blocks), plan.threads, 0, stream>>>(
        grad_y.data_ptr<T>(), x.data_ptr<T>(), weight.data_ptr<T>(), inv_rms.data_ptr<float>(),
        grad_x, partial_sums, rows, h);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    if (!need_grad_weight) return;
    grads.grad_weight = at::empty_like(weight);
    constexpr int kSumThreads = 256;
    const unsigned sum_blocks = (h + kSumThreads - 1) / kSumThreads;
    sum_partials_kernel<T><<<sum_blocks, kSumThreads, 0, stream>>>(
        partial_sums, grads.grad_weight.data_ptr<T>(), blocks, h);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return grads;
}

}  // namespace ulysses::kernels
