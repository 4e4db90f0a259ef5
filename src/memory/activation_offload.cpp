// Hidden-state offload to host memory with prefetch (see header). CUDA parts: pinned buffers,
// one side stream, events; CPU: plain copies through the same code path.
#include "memory/activation_offload.h"

#include "profile/phase_timer.h"

#ifdef ULYSSES_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace ulysses::memory {

#ifdef ULYSSES_WITH_CUDA
struct OffloadedTensor::CudaCopies {
  explicit CudaCopies(c10::Stream stream) : side(stream) {}
  c10::cuda::CUDAStream side;
  at::cuda::CUDAEvent on_host;    // recorded on `side` after the device->host copy
  at::cuda::CUDAEvent on_device;  // recorded on `side` after the host->device copy
};
#else
struct OffloadedTensor::CudaCopies {};
#endif

OffloadedTensor::OffloadedTensor(const at::Tensor& value, std::weak_ptr<OffloadedTensor> previous,
                                 c10::optional<c10::Stream> side_stream)
    : device_(value.device()),
      bytes_(static_cast<int64_t>(value.numel() * value.element_size())),
      previous_(std::move(previous)) {
  at::NoGradGuard no_grad;
#ifdef ULYSSES_WITH_CUDA
  if (value.is_cuda()) {
    TORCH_CHECK(side_stream.has_value(), "OffloadedTensor: CUDA value without a side stream");
    cuda_ = std::make_unique<CudaCopies>(*side_stream);
    const c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream(device_.index());
    at::cuda::CUDAEvent produced;  // the value is complete once the compute stream gets here
    produced.record(compute);
    host_ = at::empty(value.sizes(),
                      at::TensorOptions(value.scalar_type()).device(at::kCPU).pinned_memory(true));
    {
      c10::cuda::CUDAStreamGuard on_side(cuda_->side);
      produced.block(cuda_->side);
      // Timed on the side stream, where the copy runs beside the compute stream's work.
      profile::ScopedPhase phase("offload", profile::kOverlapped);
      host_.copy_(value, /*non_blocking=*/true);  // [bs, T, h] device -> pinned host
    }
    value.record_stream(cuda_->side);  // no reuse of its memory before the copy is done
    cuda_->on_host.record(cuda_->side);
    return;
  }
#endif
  profile::ScopedPhase phase("offload");  // CPU: a blocking copy inside the enclosing scope
  host_ = at::empty(value.sizes(), at::TensorOptions(value.scalar_type()));  // separate buffer
  host_.copy_(value);
}

OffloadedTensor::~OffloadedTensor() = default;

void OffloadedTensor::prefetch() {
  if (consumed_ || fetched_.defined()) return;
  at::NoGradGuard no_grad;
#ifdef ULYSSES_WITH_CUDA
  if (cuda_) {
    c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream(device_.index());
    // Allocated on the compute stream (where it will be used and freed). Its block may have been
    // freed by compute work still queued, so the copy also waits for the compute stream.
    fetched_ = at::empty(host_.sizes(), at::TensorOptions(host_.scalar_type()).device(device_));
    at::cuda::CUDAEvent queued;
    queued.record(compute);
    c10::cuda::CUDAStreamGuard on_side(cuda_->side);
    queued.block(cuda_->side);
    cuda_->on_host.block(cuda_->side);  // same stream; kept for clarity
    profile::ScopedPhase phase("offload", profile::kOverlapped);  // timed on the side stream
    fetched_.copy_(host_, /*non_blocking=*/true);  // [bs, T, h] pinned host -> device
    cuda_->on_device.record(cuda_->side);
    return;
  }
#endif
  profile::ScopedPhase phase("offload");  // CPU: a blocking copy inside the enclosing scope
  fetched_ = at::empty(host_.sizes(), at::TensorOptions(host_.scalar_type()).device(device_));
  fetched_.copy_(host_);
}

at::Tensor OffloadedTensor::fetch() {
  TORCH_CHECK(!consumed_,
              "OffloadedTensor: fetched twice (backward through an offloaded checkpoint again, "
              "e.g. with retain_graph, is not supported)");
  prefetch();
  consumed_ = true;
#ifdef ULYSSES_WITH_CUDA
  if (cuda_) cuda_->on_device.block(c10::cuda::getCurrentCUDAStream(device_.index()));
#endif
  host_ = at::Tensor();  // the pinned block is reused only after its copies (host allocator events)
  return std::move(fetched_);
}

std::shared_ptr<OffloadedTensor> ActivationOffloader::stash(const at::Tensor& value) {
  c10::optional<c10::Stream> stream;
#ifdef ULYSSES_WITH_CUDA
  if (value.is_cuda()) {
    if (!side_stream_ || side_stream_->device() != value.device()) {
      side_stream_ =
          c10::cuda::getStreamFromPool(/*isHighPriority=*/false, value.device().index()).unwrap();
    }
    stream = side_stream_;
  }
#endif
  auto stashed = std::make_shared<OffloadedTensor>(value, last_, stream);
  last_ = stashed;
  bytes_stashed_ += stashed->bytes();
  return stashed;
}

}  // namespace ulysses::memory
