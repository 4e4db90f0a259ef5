// fp32 gradient accumulation buffers and their bucketed reduction (see grad_buffers.h).
#include "zero/grad_buffers.h"

#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <array>
#include <deque>
#include <map>
#include <utility>

#include "common/pinned_host.h"
#include "profile/phase_timer.h"
#include "sp/contribution_window.h"

namespace ulysses::train {
namespace {

at::ScalarType accumulation_dtype(at::ScalarType param_dtype, bool in_parameter_dtype) {
  if (in_parameter_dtype) return param_dtype;
  return param_dtype == at::kDouble ? at::kDouble : at::kFloat;
}

// Runs after autograd has accumulated a half-precision contribution into a parameter's .grad():
// adds it into the fp32 buffer on the same device and releases it, so the next contribution
// starts from nothing.
struct AccumulateIntoMainGrad : public torch::autograd::PostAccumulateGradHook {
  explicit AccumulateIntoMainGrad(at::Tensor main_grad) : main_grad(std::move(main_grad)) {}
  void operator()(const torch::autograd::Variable& param) override {
    at::Tensor& grad = param.mutable_grad();
    if (!grad.defined()) return;
    main_grad.add_(grad);  // fp32 += bf16, converted element by element
    grad.reset();
  }
  at::Tensor main_grad;  // [param shape] fp32 view of the flat buffer
};

}  // namespace

// on_host: hands each contribution to its GradientBuffers and releases it.
struct AccumulateOnHost : public torch::autograd::PostAccumulateGradHook {
  AccumulateOnHost(GradientBuffers* owner, size_t index) : owner(owner), index(index) {}
  void operator()(const torch::autograd::Variable& param) override {
    at::Tensor& grad = param.mutable_grad();
    if (!grad.defined()) return;
    owner->contribute_on_host(index, grad);
    grad.reset();
  }
  GradientBuffers* owner;
  size_t index;
};

FlatLayout plan_flat_layout(const std::vector<at::Tensor>& params, int64_t shards,
                            bool sum_in_parameter_dtype) {
  const auto dtype_of = [sum_in_parameter_dtype](const at::Tensor& p) {
    return accumulation_dtype(p.scalar_type(), sum_in_parameter_dtype);
  };
  TORCH_CHECK(shards >= 1, "GradientBuffers: shards must be >= 1, got ", shards);
  using Key = std::pair<std::string, at::ScalarType>;
  std::map<Key, int64_t> numel_of;
  for (const auto& p : params) {
    if (p.requires_grad()) numel_of[{p.device().str(), dtype_of(p)}] += p.numel();
  }
  FlatLayout layout;
  std::map<Key, std::pair<int, int64_t>> cursor;  // flat index, next offset
  for (const auto& [key, numel] : numel_of) {
    cursor[key] = {static_cast<int>(layout.flat_numel.size()), 0};
    layout.flat_numel.push_back((numel + shards - 1) / shards * shards);
  }
  layout.flat_index.assign(params.size(), -1);
  layout.flat_offset.assign(params.size(), 0);
  for (size_t i = 0; i < params.size(); ++i) {
    if (!params[i].requires_grad()) continue;
    auto& [index, offset] = cursor[{params[i].device().str(), dtype_of(params[i])}];
    layout.flat_index[i] = index;
    layout.flat_offset[i] = offset;
    offset += params[i].numel();
  }
  return layout;
}

GradientBuffers::GradientBuffers(std::vector<at::Tensor> params, int64_t shards, bool on_host,
                                 bool sum_in_parameter_dtype)
    : params_(std::move(params)),
      grads_(params_.size()),
      hooked_(params_.size(), false),
      on_host_(on_host),
      staged_(params_.size()),
      host_has_sum_(params_.size(), false) {
  TORCH_CHECK(!(on_host && sum_in_parameter_dtype),
              "GradientBuffers: host buffers sum in fp32; sum_in_parameter_dtype needs on_host false");
  const FlatLayout layout = plan_flat_layout(params_, shards, sum_in_parameter_dtype);
  flat_index_ = layout.flat_index;
  flat_offset_ = layout.flat_offset;
  for (size_t f = 0; f < layout.flat_numel.size(); ++f) flats_.push_back(at::Tensor());
  for (size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor& p = params_[i];
    if (!p.requires_grad()) continue;
    TORCH_CHECK(p.is_leaf(), "GradientBuffers: parameters must be leaf tensors");
    at::Tensor& flat = flats_[flat_index_[i]];
    if (!flat.defined()) {
      const int64_t numel = layout.flat_numel[flat_index_[i]];
      const at::ScalarType dtype = accumulation_dtype(p.scalar_type(), sum_in_parameter_dtype);
      flat = on_host ? zeros_on_host({numel}, dtype, /*pinned=*/p.is_cuda())  // [padded]
                     : at::zeros({numel}, at::TensorOptions().device(p.device()).dtype(dtype));
    }
    grads_[i] = flat.narrow(0, flat_offset_[i], p.numel()).view(p.sizes());  // [param shape]
    if (!on_host && p.scalar_type() == grads_[i].scalar_type()) {
      p.mutable_grad() = grads_[i];
      continue;
    }
    p.mutable_grad().reset();
    if (on_host) {
      torch::autograd::impl::set_post_acc_grad_hooks(p, std::make_unique<AccumulateOnHost>(this, i));
    } else {
      torch::autograd::impl::set_post_acc_grad_hooks(
          p, std::make_unique<AccumulateIntoMainGrad>(grads_[i]));
    }
    hooked_[i] = true;
  }
}

GradientBuffers::~GradientBuffers() {
  for (size_t i = 0; i < params_.size(); ++i) {
    if (hooked_[i]) torch::autograd::impl::set_post_acc_grad_hooks(params_[i], nullptr);
  }
  try {
    side_streams_.synchronize();  // nothing writes freed memory
  } catch (...) {
  }
}

void GradientBuffers::contribute_on_host(size_t i, const at::Tensor& grad) {
  at::NoGradGuard no_grad;
  at::Tensor& staged = staged_[i];
  const bool first_in_window = !staged.defined();
  if (first_in_window) {
    if (host_has_sum_[i]) {
      staged = at::empty(grads_[i].sizes(), grads_[i].options().device(grad.device()));
      copy(staged, grads_[i]);  // the host sum so far, back beside the contribution
      staged.add_(grad);
    } else {
      // The sum so far is zero, so it is the contribution in fp32 (for fp32 parameters the
      // contribution itself: autograd's .grad is ours alone, and released by the hook).
      staged = grad.to(grads_[i].scalar_type());
    }
  } else {
    staged.add_(grad);  // fp32 += bf16, converted element by element
  }
  if (!sp::ContributionWindow::is_open()) {
    move_to_host(i);
    return;
  }
  if (first_in_window) pending_.push_back(i);
  const unsigned long long generation = sp::ContributionWindow::generation();
  if (window_generation_ != generation) {
    window_generation_ = generation;
    sp::ContributionWindow::when_closed([this] { move_pending_to_host(); });
  }
}

void GradientBuffers::move_to_host(size_t i) {
  copy(grads_[i], staged_[i]);
  staged_[i] = at::Tensor();
  host_has_sum_[i] = true;
}

void GradientBuffers::move_pending_to_host() {
  for (size_t i : pending_) {
    if (staged_[i].defined()) move_to_host(i);
  }
  pending_.clear();
}

void GradientBuffers::copy(at::Tensor& dst, const at::Tensor& src) {
  const at::Tensor& on_device = dst.is_cpu() ? src : dst;
  if (on_device.is_cpu()) {
    dst.copy_(src);  // host parameters: a plain copy
    return;
  }
  const c10::Device device = on_device.device();
  const c10::impl::VirtualGuardImpl impl(device.type());
  const c10::Stream compute = impl.getStream(device);
  const c10::Stream side = side_streams_.get(device);
  // The side stream waits for what the compute stream has queued (the kernels that produced the
  // sum, or the allocation of the tensor it fills), copies without blocking the host, and the
  // compute stream waits for a copy to the device before it adds to it.
  c10::Event queued(device.type());
  queued.record(compute);
  side.wait(queued);
  {
    const c10::StreamGuard on_side(side);
    profile::ScopedPhase phase("offload", profile::kOverlapped);  // timed on the side stream
    dst.copy_(src, /*non_blocking=*/true);
  }
  on_device.record_stream(side);  // its memory is not reused before the copy is done
  if (!dst.is_cpu()) {
    c10::Event copied(device.type());
    copied.record(side);
    compute.wait(copied);
  }
}

void GradientBuffers::settle() {
  if (!on_host_) return;
  move_pending_to_host();
  side_streams_.synchronize();
  if (!stale_) return;
  // What zero() left as it was: the parameters that got no sum since, and each flat's padding.
  std::vector<int64_t> used(flats_.size(), 0);  // per flat: the end of its last parameter
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!grads_[i].defined()) continue;
    if (!host_has_sum_[i]) grads_[i].zero_();
    int64_t& end = used[static_cast<size_t>(flat_index_[i])];
    end = std::max(end, flat_offset_[i] + grads_[i].numel());
  }
  for (size_t f = 0; f < flats_.size(); ++f) {
    if (flats_[f].defined() && used[f] < flats_[f].numel()) {
      flats_[f].narrow(0, used[f], flats_[f].numel() - used[f]).zero_();
    }
  }
  stale_ = false;
}

void GradientBuffers::zero() {
  settle();
  wait_in_flight();  // none after a step that ended normally
  for (auto& ranges : started_) ranges.clear();
  if (on_host_) {
    // A parameter's first sum of the step replaces its host gradient (move_to_host copies over
    // it, never adds), so the buffers are not cleared here: settle() zeros what got no sum. On
    // the host that saves a write of the whole model's fp32 gradients each step.
    stale_ = true;
  } else {
    for (auto& flat : flats_) flat.zero_();
  }
  std::fill(host_has_sum_.begin(), host_has_sum_.end(), false);
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!grads_[i].defined()) continue;
    if (hooked_[i]) {
      params_[i].mutable_grad().reset();
    } else if (!params_[i].grad().is_same(grads_[i])) {
      params_[i].mutable_grad() = grads_[i];
    }
  }
}

namespace {

int64_t bucket_numel_of(const at::Tensor& flat, int64_t bucket_bytes) {
  return std::max<int64_t>(bucket_bytes / flat.element_size(), 1);
}

}  // namespace

// Issues the sum of flats_[f][begin, end) over `group` in buckets of at most `bucket_numel`
// elements.
void GradientBuffers::start_buckets(comm::Group& group, size_t f, int64_t begin, int64_t end,
                                    int64_t bucket_numel) {
  for (int64_t start = begin; start < end; start += bucket_numel) {
    const int64_t numel = std::min(bucket_numel, end - start);
    at::Tensor bucket = flats_[f].narrow(0, start, numel);
    in_flight_.push_back(group.all_reduce_start(bucket, comm::ReduceOp::kSum));  // in place
    in_flight_ranges_.push_back({f, start, start + numel});
  }
}

void GradientBuffers::wait_in_flight() {
  for (auto& pending : in_flight_) pending.wait();
  in_flight_.clear();
  in_flight_ranges_.clear();
}

void GradientBuffers::wait_in_flight_in_order(const SummedFn& on_summed) {
  std::vector<size_t> order(in_flight_.size());
  for (size_t k = 0; k < order.size(); ++k) order[k] = k;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const BucketRange& x = in_flight_ranges_[a];
    const BucketRange& y = in_flight_ranges_[b];
    return x.flat != y.flat ? x.flat < y.flat : x.begin < y.begin;
  });
  // The buckets tile each flat (the started ranges and the rest between them), so the summed
  // prefix of a flat is the end of the last bucket waited for.
  for (size_t k : order) {
    in_flight_[k].wait();
    on_summed(in_flight_ranges_[k].flat, in_flight_ranges_[k].end);
  }
  in_flight_.clear();
  in_flight_ranges_.clear();
}

void GradientBuffers::all_reduce_start(comm::Group& group, size_t first, size_t last,
                                       int64_t bucket_bytes) {
  TORCH_CHECK(!on_host_, "GradientBuffers::all_reduce_start: not with on_host buffers");
  TORCH_CHECK(first <= last && last <= params_.size() && bucket_bytes >= 1,
              "GradientBuffers::all_reduce_start: bad range or bucket size");
  if (group.size() == 1) return;
  // Not timed as grad_sync: issuing is quick, and inside backward; all_reduce times the wait.
  started_.resize(flats_.size());
  // Within a flat the parameters lie in their order, so those of [first, last) in flat f cover
  // one contiguous element range, holding nothing else but padding.
  std::vector<std::pair<int64_t, int64_t>> range(flats_.size(), {-1, -1});
  for (size_t i = first; i < last; ++i) {
    const int f = flat_index_[i];
    if (f < 0) continue;
    const int64_t begin = flat_offset_[i], end = begin + grads_[i].numel();
    auto& r = range[static_cast<size_t>(f)];
    r = r.first < 0 ? std::make_pair(begin, end)
                    : std::make_pair(std::min(r.first, begin), std::max(r.second, end));
  }
  for (size_t f = 0; f < flats_.size(); ++f) {
    const auto [begin, end] = range[f];
    if (begin < 0) continue;
    for (const auto& [b, e] : started_[f]) {
      TORCH_CHECK(end <= b || begin >= e, "GradientBuffers::all_reduce_start: range started twice");
    }
    start_buckets(group, f, begin, end, bucket_numel_of(flats_[f], bucket_bytes));
    started_[f].emplace_back(begin, end);
    std::sort(started_[f].begin(), started_[f].end());
  }
  ++ranges_started_;
}

std::vector<c10::Event> GradientBuffers::mark_host_copies() {
  std::vector<c10::Event> events;
  if (!on_host_) return events;
  std::vector<c10::Device> devices;
  for (const at::Tensor& p : params_) {
    if (p.device().is_cpu() ||
        std::find(devices.begin(), devices.end(), p.device()) != devices.end()) {
      continue;
    }
    devices.push_back(p.device());
    events.emplace_back(p.device().type());
    events.back().record(side_streams_.get(p.device()));
  }
  return events;
}

void GradientBuffers::all_reduce_on_host(comm::Group& group, int64_t bucket_bytes,
                                         const SummedFn& on_summed) {
  const at::Device wire_device = group.device();
  struct InFlight {
    comm::Group::Pending pending;
    at::Tensor bucket;  // [n] slice of a host flat
    at::Tensor wire;    // [n] what the group sums: the bucket itself, or a wire buffer's slice
    bool pinned = false;
    size_t flat = 0;
    int64_t end = 0;  // the bucket's end in its flat
  };
  std::deque<InFlight> window;  // oldest first, at most kHostBucketsInFlight
  int64_t bytes_in_flight = 0;
  // The oldest bucket: waited for, and its sum copied back into the host flat (queued on the
  // current stream, before any later copy into the same wire buffer).
  auto finish_oldest = [&] {
    InFlight& oldest = window.front();
    oldest.pending.wait();
    if (!oldest.wire.is_same(oldest.bucket)) {
      oldest.bucket.copy_(oldest.wire, oldest.pinned);
      if (on_summed && !wire_device.is_cpu()) {  // the host reads it next
        c10::impl::VirtualGuardImpl impl(wire_device.type());
        impl.getStream(wire_device).synchronize();
      }
    }
    bytes_in_flight -= oldest.bucket.numel() * oldest.bucket.element_size();
    const size_t flat = oldest.flat;
    const int64_t end = oldest.end;
    window.pop_front();
    if (on_summed) on_summed(flat, end);
  };
  std::array<at::Tensor, kHostBucketsInFlight> wire_buffers;  // [bucket numel] on wire_device
  size_t next_buffer = 0;
  bool staged = false;
  for (size_t f = 0; f < flats_.size(); ++f) {
    at::Tensor& flat = flats_[f];
    const int64_t bucket_numel = bucket_numel_of(flat, bucket_bytes);
    const bool copied = flat.device() != wire_device;
    const bool pinned = copied && flat.is_pinned();
    staged = staged || copied;
    for (int64_t start = 0; start < flat.numel(); start += bucket_numel) {
      if (static_cast<int64_t>(window.size()) == kHostBucketsInFlight) finish_oldest();
      const int64_t numel = std::min(bucket_numel, flat.numel() - start);
      InFlight next;
      next.bucket = flat.narrow(0, start, numel);
      next.wire = next.bucket;
      next.pinned = pinned;
      next.flat = f;
      next.end = start + numel;
      if (copied) {
        // The buffer's previous bucket was waited for and its copy back queued before this copy.
        at::Tensor& buffer = wire_buffers[next_buffer];
        next_buffer = (next_buffer + 1) % wire_buffers.size();
        if (!buffer.defined() || buffer.numel() < numel ||
            buffer.scalar_type() != flat.scalar_type()) {
          buffer = at::empty({bucket_numel}, flat.options().device(wire_device));
        }
        next.wire = buffer.narrow(0, 0, numel);
        next.wire.copy_(next.bucket, pinned);
      }
      next.pending = group.all_reduce_start(next.wire, comm::ReduceOp::kSum);
      window.push_back(std::move(next));
      bytes_in_flight += numel * flat.element_size();
      host_buckets_in_flight_max_ =
          std::max(host_buckets_in_flight_max_, static_cast<int64_t>(window.size()));
      host_bytes_in_flight_max_ = std::max(host_bytes_in_flight_max_, bytes_in_flight);
    }
  }
  while (!window.empty()) finish_oldest();
  if (staged && !wire_device.is_cpu()) {  // the copies back are queued: the host reads next
    c10::impl::VirtualGuardImpl impl(wire_device.type());
    impl.getStream(wire_device).synchronize();
  }
}

void GradientBuffers::all_reduce(comm::Group& group, int64_t bucket_bytes,
                                 const SummedFn& on_summed) {
  TORCH_CHECK(bucket_bytes >= 1, "GradientBuffers::all_reduce: bucket_bytes must be >= 1");
  TORCH_CHECK(!on_summed || on_host_ ||
                  std::all_of(flats_.begin(), flats_.end(),
                              [](const at::Tensor& flat) { return flat.is_cpu(); }),
              "GradientBuffers::all_reduce: on_summed needs on_host or host buffers");
  settle();
  if (group.size() == 1) return;
  profile::ScopedPhase phase("grad_sync");
  if (on_host_) {  // all_reduce_start refuses on_host buffers: nothing was started
    all_reduce_on_host(group, bucket_bytes, on_summed);
    return;
  }
  // What all_reduce_start did not start, in buckets, then wait for everything.
  started_.resize(flats_.size());
  for (size_t f = 0; f < flats_.size(); ++f) {
    const int64_t bucket_numel = bucket_numel_of(flats_[f], bucket_bytes);
    int64_t next = 0;
    for (const auto& [begin, end] : started_[f]) {
      start_buckets(group, f, next, begin, bucket_numel);
      next = end;
    }
    start_buckets(group, f, next, flats_[f].numel(), bucket_numel);
    started_[f].clear();
  }
  if (on_summed) {
    wait_in_flight_in_order(on_summed);
  } else {
    wait_in_flight();
  }
}

void GradientBuffers::copy_to_param_grads() {
  settle();
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!hooked_[i]) continue;
    params_[i].mutable_grad() = grads_[i].to(params_[i].device(), params_[i].scalar_type());
  }
}

int64_t GradientBuffers::bytes() const {
  int64_t total = 0;
  for (const auto& flat : flats_) total += flat.numel() * flat.element_size();
  return total;
}

}  // namespace ulysses::train
