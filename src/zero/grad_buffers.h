// Gradient accumulation in fp32 (Megatron / DeepSpeed call it `main_grad`), or in the parameters'
// dtype (memory.precision bf16-states): every parameter's gradient is summed over tiles, recomputes
// and micro-batches into a view of one flat buffer, and reduced over ranks from there in buckets,
// without a gathered copy.
#pragma once
#include <ATen/ATen.h>
#include <c10/core/Stream.h>

#include <c10/core/Event.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "comm/group.h"
#include "common/side_streams.h"

namespace ulysses::train {

// Default size of one all-reduce over a flat gradient buffer.
inline constexpr int64_t kDefaultGradBucketBytes = int64_t{128} << 20;  // 128 MiB

// Where GradientBuffers(params, shards) puts each parameter (pure: allocates nothing): flat f has
// flat_numel[f] elements (padded to a multiple of shards); parameter i lies in flat flat_index[i]
// (-1 when it does not require grad) from element flat_offset[i]. Flats are ordered by (device,
// accumulation dtype), parameters within a flat in their order. sum_in_parameter_dtype: as the
// GradientBuffers constructor's.
struct FlatLayout {
  std::vector<int64_t> flat_numel;
  std::vector<int> flat_index;
  std::vector<int64_t> flat_offset;
};
FlatLayout plan_flat_layout(const std::vector<at::Tensor>& params, int64_t shards,
                            bool sum_in_parameter_dtype = false);

// Owns one flat accumulation buffer per (device, accumulation dtype) and a view of it per
// parameter, in the parameters' order. The accumulation dtype is fp32, or fp64 for fp64
// parameters; with sum_in_parameter_dtype it is each parameter's own dtype (bf16 sums of bf16
// parameters, summed over ranks in bf16: what torch does with a bf16 model), so every parameter
// is of the first kind below.
//  - fp32 / fp64 parameters: param.grad() IS the view, so autograd's AccumulateGrad adds every
//    contribution into it in place (backward runs with grad mode off).
//  - bf16 / fp16 parameters, and every parameter with on_host: a post-accumulate-grad hook adds
//    each contribution (the grad autograd just produced) into the fp32 view and releases it, so
//    param.grad() stays undefined between contributions and no bf16 sum ever exists.
// Invariants: grads()[i] has params[i]'s shape, the accumulation dtype and params[i]'s device
// (the CPU with on_host); the views of
// one buffer cover it without overlap, in parameter order. Hooks are installed for the lifetime of
// this object (destruction removes them); at most one GradientBuffers per parameter at a time.
// Not thread-safe; not copyable.
class GradientBuffers {
 public:
  // REQUIRES: params are leaf tensors; the ones that do not require grad get no buffer (their
  // entry in grads() is undefined); shards >= 1. Allocates zeroed buffers, each padded at its end
  // with zeros to a multiple of `shards` elements (ZeRO splits them into `shards` equal parts;
  // the padding is never written by autograd and stays zero until ZeRO reuses the buffer).
  // on_host: the buffers live in host memory whatever the parameters' device (page-locked when
  // the parameters are on a GPU), and every parameter goes through the hook. With optimizer
  // offload this is where the fused host AdamW reads them, so no fp32 gradient of the whole model
  // ever occupies device memory (DeepSpeed's ZeRO-Offload keeps its fp32 gradients on the host
  // too). A parameter's contributions are summed in fp32 beside the parameter, starting from its
  // host sum so far, and the sum goes back to the host buffer: at once, or, for contributions that
  // arrive while an sp::ContributionWindow is open (the tiles of a sequence-tiled computation,
  // sp/sequence_tiled_compute.h; the tiled MLP sums its tiles itself and contributes once), once
  // when the window closes, so tiled weights leave the device once per micro-batch and not once
  // per tile. On a GPU both copies are non_blocking on a side stream, so backward does not wait
  // for them (settle() does). Device memory: the fp32 sums of the parameters of one open window
  // plus those in flight. The sums are the same, bit for bit, as on the device: the
  // same fp32 additions in the same order.
  // sum_in_parameter_dtype: accumulate in each parameter's dtype (above). REQUIRES: not
  // with on_host.
  explicit GradientBuffers(std::vector<at::Tensor> params, int64_t shards = 1,
                           bool on_host = false, bool sum_in_parameter_dtype = false);
  ~GradientBuffers();
  GradientBuffers(const GradientBuffers&) = delete;
  GradientBuffers& operator=(const GradientBuffers&) = delete;

  // on_host: waits until every contribution is in the host buffers (moves the sums still beside
  // the parameters, waits for the copies in flight). A no-op without on_host, and when nothing is
  // pending. compute_gradients calls it after the last micro-batch; zero(), all_reduce() and
  // copy_to_param_grads() call it first. grads() must not be read on the host before it.
  void settle();

  // Zeros every buffer (on_host: as seen after the next settle(), which clears only what got no
  // sum in between; the sums replace the rest), and points each fp32/fp64 parameter's .grad() at its view again (in case
  // someone replaced it) and releases any bf16/fp16 .grad() left behind.
  void zero();

  // The accumulated gradients, aligned with the constructor's params: [param shape], the
  // accumulation dtype (fp32, fp64, or the parameter's with sum_in_parameter_dtype).
  const std::vector<at::Tensor>& grads() const { return grads_; }

  // Sums every buffer over `group` in place, `bucket_bytes` at a time (contiguous slices of the
  // flat buffer: no extra copy of the gradients). Every member must call it with the same
  // parameters in the same order. REQUIRES: bucket_bytes >= 1.
  // Ranges already started by all_reduce_start are waited for, not reduced again.
  // on_host: at most kHostBucketsInFlight buckets are on the wire at once, bucket i + 2 starting
  // only after bucket i was waited for and its copy back into the host buffer issued. With the group's device elsewhere (a GPU
  // under NCCL or Gloo) each bucket is copied into one of two device wire buffers (non_blocking
  // from page-locked memory), summed there, and copied back as soon as it completes; at return
  // the host buffers hold the sums (one sync with the group's device). So no more than two
  // buckets of the fp32 gradient ever occupy device memory here. With the group on the host's
  // device (Gloo on CPU) the buckets are summed in place, two at a time as well.
  // on_summed (may be empty; REQUIRES on_host or every flat on the CPU): called as the sums land,
  // on this thread, with (flat f, end) once flats()[f]'s elements [0, end) hold their sums over
  // the group, readable on the host (so, with the group on a device, after a wait for that
  // bucket's copy back). Flats complete in order, each from its start: without on_host the
  // buckets (all_reduce_start's included) are waited for in that order, whatever order they were
  // issued in.
  using SummedFn = std::function<void(size_t flat, int64_t end)>;
  void all_reduce(comm::Group& group, int64_t bucket_bytes = kDefaultGradBucketBytes,
                  const SummedFn& on_summed = {});
  // Buckets the on_host all-reduce keeps on the wire at once, at most.
  static constexpr int64_t kHostBucketsInFlight = 2;
  // on_host: the most buckets, and bytes of them, that all_reduce has had on the wire at once
  // since the buffers were made (0 before the first reduction over more than one rank).
  int64_t host_buckets_in_flight_max() const { return host_buckets_in_flight_max_; }
  int64_t host_bytes_in_flight_max() const { return host_bytes_in_flight_max_; }

  // Starts summing over `group` the gradients of params()[first, last) (a decoder layer's, once
  // its last contribution of the step is in), `bucket_bytes` at a time, and returns at once:
  // the sums run while backward goes on, and all_reduce() waits for them and reduces only the
  // rest. Every member must start the same ranges in the same order. REQUIRES: not on_host (the
  // host sums arrive asynchronously; they are reduced by all_reduce); first <= last <=
  // params().size(); the range not started before in this step.
  void all_reduce_start(comm::Group& group, size_t first, size_t last,
                        int64_t bucket_bytes = kDefaultGradBucketBytes);
  // Ranges started by all_reduce_start since the buffers were made (tests).
  int64_t ranges_started() const { return ranges_started_; }

  // on_host, during backward: whether grads()[i] holds this step's sum so far on the host (not
  // beside the parameter, nor zero() waiting for settle()). On a device its copy may still be in
  // flight: mark_host_copies() gives the events to wait for.
  bool host_sum_ready(size_t i) const {
    return on_host_ && host_has_sum_[i] && !staged_[i].defined();
  }
  // on_host: an event per device side stream, recorded after the copies to the host queued so
  // far; none on the CPU (its copies are done when issued).
  std::vector<c10::Event> mark_host_copies();

  // Writes each accumulated gradient into its parameter's .grad() in the parameter's dtype (a
  // no-op for fp32/fp64 parameters, whose .grad() is the buffer), for callers that read .grad().
  void copy_to_param_grads();

  // Total bytes held by the buffers.
  int64_t bytes() const;

  // The flat buffers ([padded numel], accumulation dtype), and where each parameter's view lies:
  // grads()[i] is flats()[flat_index(i)].narrow(0, flat_offset(i), numel) viewed as the
  // parameter's shape. flat_index(i) is -1 for a parameter without a buffer.
  const std::vector<at::Tensor>& flats() const { return flats_; }
  const std::vector<at::Tensor>& params() const { return params_; }
  int flat_index(size_t i) const { return flat_index_[i]; }
  int64_t flat_offset(size_t i) const { return flat_offset_[i]; }

 private:
  std::vector<at::Tensor> params_;  // [any], the module's parameters
  std::vector<at::Tensor> grads_;   // [param shape] views into flats_, accumulation dtype
  std::vector<bool> hooked_;        // params_[i] has our post-accumulate-grad hook
  std::vector<at::Tensor> flats_;   // [sum of numel, padded] one per (device, dtype)
  std::vector<int> flat_index_;     // per parameter: its flat in flats_, or -1
  std::vector<int64_t> flat_offset_;  // per parameter: its first element in that flat

  // on_host: parameter i's contribution `grad` (its dtype, its device) into its fp32 sum.
  friend struct AccumulateOnHost;
  void contribute_on_host(size_t i, const at::Tensor& grad);
  void move_to_host(size_t i);  // staged_[i] -> grads_[i] (replaces it), then drops staged_[i]
  void move_pending_to_host();
  void copy(at::Tensor& dst, const at::Tensor& src);  // device <-> host, on the side stream

  // all_reduce_start: the sums in flight, and per flat the element ranges [begin, end) started
  // this step (kept sorted), which all_reduce leaves out.
  std::vector<comm::Group::Pending> in_flight_;
  struct BucketRange {
    size_t flat;
    int64_t begin, end;
  };
  std::vector<BucketRange> in_flight_ranges_;  // in_flight_[k]'s elements
  std::vector<std::vector<std::pair<int64_t, int64_t>>> started_;
  int64_t ranges_started_ = 0;
  void wait_in_flight();
  // Waits for in_flight_ in flat order, calling on_summed as each flat's summed prefix grows.
  void wait_in_flight_in_order(const SummedFn& on_summed);
  void start_buckets(comm::Group& group, size_t f, int64_t begin, int64_t end,
                     int64_t bucket_numel);
  void all_reduce_on_host(comm::Group& group, int64_t bucket_bytes, const SummedFn& on_summed);
  int64_t host_buckets_in_flight_max_ = 0;
  int64_t host_bytes_in_flight_max_ = 0;

  bool on_host_ = false;
  std::vector<at::Tensor> staged_;     // per parameter: [param shape] fp32 sum beside the param
  std::vector<bool> host_has_sum_;     // per parameter: grads_[i] holds this step's sum so far
  bool stale_ = false;  // on_host: zero() ran, and settle() has not yet zeroed what got no sum
  std::vector<size_t> pending_;        // staged in the open window, moved when it closes
  unsigned long long window_generation_ = 0;  // the window pending_ is registered with
  SideStreams side_streams_;           // for the copies
};

}  // namespace ulysses::train
