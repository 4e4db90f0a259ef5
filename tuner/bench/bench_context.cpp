// Shared pieces of ulysses-bench: cross-rank reductions, the device timer (see bench_context.h).
#include "tuner/bench/bench_context.h"

#include <chrono>

#ifdef ULYSSES_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace ulysses::bench {
namespace {

double now_ms() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

double BenchContext::max_over(comm::Group& group, double local) {
  at::Tensor value = at::full({1}, local, at::TensorOptions().dtype(at::kDouble).device(device));
  group.all_reduce(value, comm::ReduceOp::kMax);
  return value.cpu().item<double>();
}

bool BenchContext::all_ok(comm::Group& group, bool ok) {
  return max_over(group, ok ? 0.0 : 1.0) == 0.0;
}

void synchronize(const at::Device& device) {
#ifdef ULYSSES_WITH_CUDA
  if (device.is_cuda()) {
    c10::cuda::CUDAGuard guard(device.index());
    cudaDeviceSynchronize();
  }
#endif
}

DeviceTimer::DeviceTimer(const at::Device& device) : device_(device) {
#ifdef ULYSSES_WITH_CUDA
  if (device_.is_cuda()) {
    c10::cuda::CUDAGuard guard(device_.index());
    cudaEvent_t start = nullptr, stop = nullptr;
    TORCH_CHECK(cudaEventCreate(&start) == cudaSuccess && cudaEventCreate(&stop) == cudaSuccess,
                "DeviceTimer: cudaEventCreate failed");
    start_event_ = start;
    stop_event_ = stop;
  }
#endif
}

DeviceTimer::~DeviceTimer() {
#ifdef ULYSSES_WITH_CUDA
  if (start_event_ != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(start_event_));
  if (stop_event_ != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(stop_event_));
#endif
}

void DeviceTimer::start() {
#ifdef ULYSSES_WITH_CUDA
  if (start_event_ != nullptr) {
    cudaEventRecord(static_cast<cudaEvent_t>(start_event_),
                    c10::cuda::getCurrentCUDAStream(device_.index()).stream());
    return;
  }
#endif
  start_ms_ = now_ms();
}

double DeviceTimer::stop_ms() {
#ifdef ULYSSES_WITH_CUDA
  if (stop_event_ != nullptr) {
    cudaEvent_t start = static_cast<cudaEvent_t>(start_event_);
    cudaEvent_t stop = static_cast<cudaEvent_t>(stop_event_);
    cudaEventRecord(stop, c10::cuda::getCurrentCUDAStream(device_.index()).stream());
    cudaEventSynchronize(stop);
    float ms = 0.0f;
    TORCH_CHECK(cudaEventElapsedTime(&ms, start, stop) == cudaSuccess,
                "DeviceTimer: cudaEventElapsedTime failed");
    return ms;
  }
#endif
  return now_ms() - start_ms_;
}

std::string bench_name(const std::string& base,
                       const std::vector<std::pair<std::string, std::string>>& args) {
  std::string name = base;
  for (const auto& [key, value] : args) name += "/" + key + ":" + value;
  return name;
}

}  // namespace ulysses::bench
