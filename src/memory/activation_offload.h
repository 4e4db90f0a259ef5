// CPU offload of checkpointed hidden states: a layer's saved input [bs, T, h] leaves
// the device right after the layer's forward and comes back for its recompute in backward.
//
// On CUDA the copies run on one side stream per offloader into pinned host buffers, ordered
// against the compute stream with events, so that they overlap compute; backward prefetches the
// previous layer's input while the current layer recomputes. On CPU the same code path runs
// synchronously (a copy into a separate host buffer and back), so it is testable without a GPU.
#pragma once
#include <ATen/ATen.h>
#include <c10/core/Stream.h>
#include <c10/util/Optional.h>

#include <atomic>
#include <memory>

namespace ulysses::memory {

// One offloaded tensor; created by ActivationOffloader::stash.
// Invariants: until fetch(), host_ holds the value (CUDA: once on_host is reached); after
// prefetch(), fetched_ holds it on the device (CUDA: once on_device is reached).
class OffloadedTensor {
 public:
  // Use ActivationOffloader::stash. `side_stream` is the offload stream for CUDA values.
  OffloadedTensor(const at::Tensor& value, std::weak_ptr<OffloadedTensor> previous,
                  c10::optional<c10::Stream> side_stream);
  ~OffloadedTensor();

  // Starts copying the value back to its device (CUDA: asynchronously on the side stream, after
  // the host copy has finished and after the work queued so far on the current stream; CPU: at
  // once). No-op when already started.
  void prefetch();

  // The value on its original device with its dtype and shape, usable on the current stream
  // (CUDA: the current stream waits for the copy). Drops this object's references, so the host
  // buffer goes back to the allocator. Throws c10::Error when called twice (e.g. a second
  // backward through the same graph with retain_graph).
  at::Tensor fetch();

  // The tensor stashed just before this one by the same offloader (the previous layer's input
  // in the same forward pass), or null when it is gone.
  std::shared_ptr<OffloadedTensor> previous() const { return previous_.lock(); }

  int64_t bytes() const { return bytes_; }
  // The host copy: [value shape], pinned for CUDA values; undefined after fetch(). For tests.
  const at::Tensor& host_copy() const { return host_; }

 private:
  struct CudaCopies;  // events and stream, defined in the .cpp for CUDA builds

  at::Tensor host_;     // [value shape] host copy
  at::Tensor fetched_;  // [value shape] on the original device once prefetch() ran
  at::Device device_;
  int64_t bytes_ = 0;
  bool consumed_ = false;
  std::weak_ptr<OffloadedTensor> previous_;
  std::unique_ptr<CudaCopies> cuda_;  // null for CPU values
};

// Stashes hidden states in host memory. One per model; its stash() runs in the layers' forward,
// fetch()/prefetch() of the handles in their backward. Not for forward passes running at the same
// time on several threads.
class ActivationOffloader {
 public:
  // Starts moving `value` [bs, T, h] to host memory and returns its handle, linked to the
  // previously stashed tensor for prefetching. The caller may drop `value` at once (CUDA: the
  // allocator does not reuse its memory before the copy has finished).
  std::shared_ptr<OffloadedTensor> stash(const at::Tensor& value);

  // Bytes stashed so far.
  int64_t bytes_stashed() const { return bytes_stashed_.load(); }

 private:
  std::weak_ptr<OffloadedTensor> last_;
  std::atomic<int64_t> bytes_stashed_{0};
  c10::optional<c10::Stream> side_stream_;  // CUDA offload stream, created on the first stash
};

}  // namespace ulysses::memory
