// Fused SwiGLU forward and backward (see swiglu.h). The ATen path it replaces is beside it in
// swiglu.cpp: at::silu(gate) * up (autograd through silu and mul for backward).
// Element-wise, 16-byte loads where every tensor is 16-byte aligned and the element count a
// multiple of the vector width (one element per thread step otherwise), grid-stride loops.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <initializer_list>

#include "kernels/cuda_common.cuh"
#include "kernels/swiglu.h"
#include "kernels/tensor_checks.h"

namespace ulysses::kernels {
namespace {

using cuda::load;
using cuda::round_to;
using cuda::store;

constexpr int kThreads = 256;

// silu(v) = v / (1 + exp(-v)), in ATen's formula (forward and backward use it alike).
__device__ __forceinline__ float silu(float v) { return v / (1.0f + expf(-v)); }
__device__ __forceinline__ float sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }

// out [n] = round(round(silu(gate)) * up), n = vectors * kVec.
template <typename T, int kVec>
__global__ void __launch_bounds__(kThreads)
    swiglu_forward_kernel(const T* __restrict__ gate, const T* __restrict__ up,
                          T* __restrict__ out, int64_t vectors) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t v = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; v < vectors;
       v += stride) {
    float g[kVec], u[kVec], o[kVec];
    load<T, kVec>(gate + v * kVec, g);
    load<T, kVec>(up + v * kVec, u);
#pragma unroll
    for (int i = 0; i < kVec; ++i) o[i] = round_to<T>(silu(g[i])) * u[i];
    store<T, kVec>(out + v * kVec, o);
  }
}

// grad_up = round(dy * round(silu(gate))); grad_gate = round(round(dy * up) * sigmoid(gate) *
// (1 + gate * (1 - sigmoid(gate)))), as mul's and silu's backward compute them.
template <typename T, int kVec>
__global__ void __launch_bounds__(kThreads)
    swiglu_backward_kernel(const T* __restrict__ grad_out, const T* __restrict__ gate,
                           const T* __restrict__ up, T* __restrict__ grad_gate,
                           T* __restrict__ grad_up, int64_t vectors) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t v = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; v < vectors;
       v += stride) {
    float dy[kVec], g[kVec], u[kVec], dg[kVec], du[kVec];
    load<T, kVec>(grad_out + v * kVec, dy);
    load<T, kVec>(gate + v * kVec, g);
    load<T, kVec>(up + v * kVec, u);
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      const float s = sigmoid(g[i]);
      du[i] = dy[i] * round_to<T>(silu(g[i]));
      dg[i] = round_to<T>(dy[i] * u[i]) * s * (1.0f + g[i] * (1.0f - s));
    }
    store<T, kVec>(grad_gate + v * kVec, dg);
    store<T, kVec>(grad_up + v * kVec, du);
  }
}

// Calls fn(T{}, std::integral_constant<int, vec>, vectors, blocks) for the dtype T of the tensors
// (the first one's), vec = 16 / sizeof(T) where every tensor is 16-byte aligned and n a multiple of
// it (else 1), n / vec vectors, and the blocks of kThreads that `kernel_of(T{}, vec)` fills the
// device with.
template <typename KernelOf, typename Fn>
void launch_elementwise(std::initializer_list<at::Tensor> tensors, const char* what,
                        KernelOf&& kernel_of, Fn&& fn) {
  const at::Tensor& first = *tensors.begin();
  const int64_t n = first.numel();
  cuda::dispatch_dtype(first.scalar_type(), what, [&](auto tag) {
    constexpr int kFull = 16 / static_cast<int>(sizeof(decltype(tag)));
    bool vectorized = n % kFull == 0;
    for (const at::Tensor& t : tensors) vectorized = vectorized && aligned16(t);
    auto launch = [&](auto vec) {
      const int64_t vectors = n / decltype(vec)::value;
      const int64_t blocks = cuda::resident_blocks(kernel_of(tag, vec), kThreads,
                                                   (vectors + kThreads - 1) / kThreads);
      fn(tag, vec, vectors, static_cast<unsigned>(blocks));
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    };
    if (vectorized) return launch(std::integral_constant<int, kFull>{});
    launch(std::integral_constant<int, 1>{});
  });
}

void check_inputs(const char* what, const at::Tensor& gate, const at::Tensor& up) {
  TORCH_CHECK(swiglu_fusable(gate, up), what, ": unsupported gate ", gate.sizes(), " ",
              gate.scalar_type(), " / up ", up.sizes(), " ", up.scalar_type());
}

}  // namespace

at::Tensor swiglu_forward(const at::Tensor& gate, const at::Tensor& up) {
  check_inputs("swiglu_forward", gate, up);
  const c10::cuda::CUDAGuard guard(gate.device());
  at::Tensor out = at::empty_like(gate);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  auto kernel_of = [](auto tag, auto vec) {
    return swiglu_forward_kernel<decltype(tag), decltype(vec)::value>;
  };
  launch_elementwise({gate, up, out}, "swiglu_forward", kernel_of,
                     [&](auto tag, auto vec, int64_t vectors, unsigned blocks) {
                       using T = decltype(tag);
                       const auto kernel = kernel_of(tag, vec);
                       kernel<<<blocks, kThreads, 0, stream>>>(
                           gate.data_ptr<T>(), up.data_ptr<T>(), out.data_ptr<T>(), vectors);
                     });
  return out;
}

SwigluGrads swiglu_backward(const at::Tensor& grad_out_in, const at::Tensor& gate,
                            const at::Tensor& up) {
  check_inputs("swiglu_backward", gate, up);
  TORCH_CHECK(grad_out_in.sizes() == gate.sizes() &&
                  grad_out_in.scalar_type() == gate.scalar_type() &&
                  grad_out_in.device() == gate.device(),
              "swiglu_backward: grad_out ", grad_out_in.sizes(), " ", grad_out_in.scalar_type(),
              " does not match gate");
  const c10::cuda::CUDAGuard guard(gate.device());
  const at::Tensor grad_out = grad_out_in.contiguous();
  SwigluGrads grads{at::empty_like(gate), at::empty_like(up)};
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  auto kernel_of = [](auto tag, auto vec) {
    return swiglu_backward_kernel<decltype(tag), decltype(vec)::value>;
  };
  launch_elementwise({gate, up, grad_out, grads.grad_gate, grads.grad_up}, "swiglu_backward",
                     kernel_of, [&](auto tag, auto vec, int64_t vectors, unsigned blocks) {
                       using T = decltype(tag);
                       const auto kernel = kernel_of(tag, vec);
                       kernel<<<blocks, kThreads, 0, stream>>>(
                           grad_out.data_ptr<T>(), gate.data_ptr<T>(), up.data_ptr<T>(),
                           grads.grad_gate.data_ptr<T>(), grads.grad_up.data_ptr<T>(), vectors);
                     });
  return grads;
}

}  // namespace ulysses::kernels
