// Hidden-state offload to host memory with prefetch (see header). CUDA parts: page-locked
// blocks of exact size, one side stream, events; CPU: plain copies through the same code path.
#include "memory/activation_offload.h"

#include <algorithm>

#include "common/pinned_host.h"
#include "profile/phase_timer.h"

#ifdef ULYSSES_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace ulysses::memory {

at::Tensor HostBlockPool::take(int64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto same = std::find_if(free_.begin(), free_.end(),
                           [&](const at::Tensor& b) { return b.numel() == bytes; });
  if (same != free_.end()) {
    at::Tensor block = std::move(*same);
    free_.erase(same);
    return block;
  }
  for (const at::Tensor& b : free_) bytes_held_ -= b.numel();
  free_.clear();  // blocks of another length: unlocked and freed with their last reference
  bytes_held_ += bytes;
  return zeros_on_host({bytes}, at::kByte, pinned_);
}

void HostBlockPool::give_back(at::Tensor block) {
  std::lock_guard<std::mutex> lock(mutex_);
  free_.push_back(std::move(block));
}

int64_t HostBlockPool::bytes_held() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return bytes_held_;
}

int64_t HostBlockPool::free_blocks() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(free_.size());
}

namespace {

// A [sizes] tensor of `dtype` over a block of a pool.
at::Tensor view_of(const at::Tensor& block, at::IntArrayRef sizes, at::ScalarType dtype) {
  return block.view(dtype).view(sizes);
}

}  // namespace

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
                                 c10::optional<c10::Stream> side_stream,
                                 std::shared_ptr<HostBlockPool> pool)
    : pool_(std::move(pool)),
      device_(value.device()),
      bytes_(static_cast<int64_t>(value.numel() * value.element_size())),
      previous_(std::move(previous)) {
  at::NoGradGuard no_grad;
  block_ = pool_->take(bytes_);
  host_ = view_of(block_, value.sizes(), value.scalar_type());
#ifdef ULYSSES_WITH_CUDA
  if (value.is_cuda()) {
    TORCH_CHECK(side_stream.has_value(), "OffloadedTensor: CUDA value without a side stream");
    cuda_ = std::make_unique<CudaCopies>(*side_stream);
    const c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream(device_.index());
    at::cuda::CUDAEvent produced;  // the value is complete once the compute stream gets here
    produced.record(compute);
    {
      c10::cuda::CUDAStreamGuard on_side(cuda_->side);
      produced.block(cuda_->side);
      // Timed on the side stream, where the copy runs beside the compute stream's work.
      profile::ScopedPhase phase("offload", profile::kOverlapped);
      host_.copy_(value, /*non_blocking=*/true);  // [bs, T, h] device -> page-locked host
    }
    value.record_stream(cuda_->side);  // no reuse of its memory before the copy is done
    cuda_->on_host.record(cuda_->side);
    return;
  }
#endif
  profile::ScopedPhase phase("offload");  // CPU: a blocking copy inside the enclosing scope
  host_.copy_(value);                     // into a separate buffer
}

OffloadedTensor::~OffloadedTensor() {
  if (!block_.defined()) return;  // fetched: the block went back then
  host_ = at::Tensor();
#ifdef ULYSSES_WITH_CUDA
  // Never fetched (no backward, or an error): copies into or out of the block may still be
  // queued; wait for them, as the block may be freed with the pool.
  if (cuda_) cuda_->side.synchronize();
#endif
  pool_->give_back(std::move(block_));
}

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
    fetched_.copy_(host_, /*non_blocking=*/true);  // [bs, T, h] page-locked host -> device
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
  // The block is handed out again only to a later stash's copy on the same side stream, which
  // runs after the copy out of it queued above.
  host_ = at::Tensor();
  pool_->give_back(std::move(block_));
  return std::move(fetched_);
}

std::shared_ptr<OffloadedTensor> ActivationOffloader::stash(const at::Tensor& value) {
  c10::optional<c10::Stream> stream;
#ifdef ULYSSES_WITH_CUDA
  if (value.is_cuda()) {
    if (!side_stream_ || side_stream_->device() != value.device()) {
      side_stream_ =
          c10::cuda::getStreamFromPool(/*isHighPriority=*/false, value.device().index()).unwrap();
      pool_.reset();  // a pool serves one stream
    }
    stream = side_stream_;
  }
#endif
  if (!pool_) pool_ = std::make_shared<HostBlockPool>(/*pinned=*/value.is_cuda());
  auto stashed = std::make_shared<OffloadedTensor>(value, last_, stream, pool_);
  last_ = stashed;
  bytes_stashed_ += stashed->bytes();
  return stashed;
}

const HostBlockPool& ActivationOffloader::host_blocks() const {
  static const HostBlockPool kNone(/*pinned=*/false);
  return pool_ ? *pool_ : kNone;
}

}  // namespace ulysses::memory
