// Blocking collectives over a c10d backend (see group.h).
#include "comm/group.h"

#include <numeric>
#include <utility>

#include "comm/errors.h"
#include "common/error.h"

namespace ulysses::comm {
namespace {

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return c10d::ReduceOp(c10d::ReduceOp::SUM);
    case ReduceOp::kMax:
      return c10d::ReduceOp(c10d::ReduceOp::MAX);
    case ReduceOp::kMin:
      return c10d::ReduceOp(c10d::ReduceOp::MIN);
  }
  TORCH_INTERNAL_ASSERT(false, "unknown ReduceOp");
}

int64_t sum_of(const std::vector<int64_t>& splits) {
  return std::accumulate(splits.begin(), splits.end(), int64_t{0});
}

}  // namespace

// Gloo has no bfloat16 kernels: such tensors travel as float32, which is exact for every
// collective here except all_reduce, whose sum is then rounded once at the end.
at::Tensor to_wire(const at::Tensor& t, const at::Device& device, bool is_gloo) {
  const bool as_float = is_gloo && t.scalar_type() == at::kBFloat16;
  return t.to(device, as_float ? at::kFloat : t.scalar_type()).contiguous();
}

Group Group::single(std::string name, int global_rank, const at::Device& device) {
  Group group;
  group.device_ = device;
  group.name_ = std::move(name);
  group.global_ranks_ = {global_rank};
  group.rank_ = 0;
  return group;
}

Group::Group(std::string name, std::vector<int> global_ranks, int rank,
             c10::intrusive_ptr<c10d::Backend> backend, const at::Device& device,
             double timeout_s)
    : name_(std::move(name)),
      global_ranks_(std::move(global_ranks)),
      rank_(rank),
      backend_(std::move(backend)),
      device_(device),
      timeout_s_(timeout_s) {
  TORCH_INTERNAL_ASSERT(backend_, "group ", name_, ": null backend");
  is_gloo_ = backend_->getBackendName() == "gloo";
  TORCH_INTERNAL_ASSERT(global_ranks_.size() >= 2 && backend_->getSize() == size(), "group ", name_,
                        ": backend size ", backend_->getSize(), " != ", size(), " ranks");
  TORCH_INTERNAL_ASSERT(rank_ >= 0 && rank_ < size() && backend_->getRank() == rank_);
}

std::string Group::backend_name() const {
  return backend_ ? backend_->getBackendName() : std::string("none");
}

template <typename StartFn>
c10::intrusive_ptr<c10d::Work> Group::start_work(const char* op, StartFn&& start) {
  try {
    return start();
  } catch (const c10::DistError& e) {  // e.g. NCCL communicator setup with a dead peer
    throw CommError(describe_comm_failure(op, name_, timeout_s_, exception_text(e)));
  }
}

void Group::wait_work(const char* op, const c10::intrusive_ptr<c10d::Work>& work) {
  try {
    work->wait();
  } catch (const std::exception& e) {
    // An allocation that failed inside the backend (under memory.limit_gib, say) is this rank
    // running out of memory, not a communication failure: it keeps its own exit status.
    if (is_out_of_memory_text(e.what())) throw;
    throw CommError(describe_comm_failure(op, name_, timeout_s_, exception_text(e)));
  }
}

template <typename StartFn>
void Group::run(const char* op, StartFn&& start) {
  wait_work(op, start_work(op, std::forward<StartFn>(start)));
}

void Group::all_reduce(at::Tensor& t, ReduceOp op) { all_reduce_start(t, op).wait(); }

at::Tensor Group::all_to_all_single(const at::Tensor& input,
                                    const std::vector<int64_t>& output_splits,
                                    const std::vector<int64_t>& input_splits) {
  return all_to_all_start(input, output_splits, input_splits).wait();
}

Group::Pending Group::all_to_all_start(const at::Tensor& input,
                                       const std::vector<int64_t>& output_splits,
                                       const std::vector<int64_t>& input_splits) {
  TORCH_CHECK(input.dim() >= 1, "all_to_all_single on group ", name_, ": input must have dim >= 1");
  const int64_t rows = input.size(0);
  TORCH_CHECK(input_splits.empty() || static_cast<int>(input_splits.size()) == size(),
              "all_to_all_single on group ", name_, ": ", input_splits.size(), " input splits for ",
              size(), " ranks");
  TORCH_CHECK(output_splits.empty() || static_cast<int>(output_splits.size()) == size(),
              "all_to_all_single on group ", name_, ": ", output_splits.size(),
              " output splits for ", size(), " ranks");
  TORCH_CHECK(input_splits.empty() || sum_of(input_splits) == rows, "all_to_all_single on group ",
              name_, ": input splits sum to ", sum_of(input_splits), " but dim 0 is ", rows);
  TORCH_CHECK(!input_splits.empty() || rows % size() == 0, "all_to_all_single on group ", name_,
              ": dim 0 (", rows, ") is not divisible by the group size ", size());
  const int64_t out_rows = output_splits.empty() ? rows : sum_of(output_splits);
  std::vector<int64_t> out_shape = input.sizes().vec();
  out_shape[0] = out_rows;

  Pending pending;
  pending.op_ = "all_to_all";
  if (!backend_) {
    TORCH_CHECK(out_rows == rows, "all_to_all_single on group ", name_, ": output splits sum to ",
                out_rows, " but this single rank sends ", rows);
    const at::Tensor out = input.clone(at::MemoryFormat::Contiguous);
    pending.finish_ = [out] { return out; };
    return pending;
  }
  pending.group_ = this;
  at::Tensor in = to_wire(input, device_, is_gloo_);
  at::Tensor out = at::empty(out_shape, in.options());  // [out_rows, ...]
  pending.wire_ = {{in, out}};
  std::vector<int64_t> out_counts = output_splits;
  std::vector<int64_t> in_counts = input_splits;
  pending.work_ = start_work(pending.op_, [&] {
    return backend_->alltoall_base(out, in, out_counts, in_counts);
  });
  const at::Device device = input.device();
  const at::ScalarType dtype = input.scalar_type();
  pending.finish_ = [out, device, dtype] { return out.to(device, dtype); };
  return pending;
}

at::Tensor Group::all_gather(const at::Tensor& t) { return all_gather_start(t).wait(); }

Group::Pending Group::all_gather_start(const at::Tensor& t, at::Tensor into) {
  std::vector<int64_t> out_shape = {static_cast<int64_t>(size())};
  for (int64_t s : t.sizes()) out_shape.push_back(s);
  if (into.defined()) {
    TORCH_CHECK(into.sizes().equals(out_shape) && into.is_contiguous() &&
                    into.scalar_type() == t.scalar_type() && into.device() == t.device(),
                "all_gather_start on group ", name_, ": `into` must be a contiguous ",
                c10::IntArrayRef(out_shape), " ", t.scalar_type(), " tensor on ", t.device(),
                ", got ", into.sizes(), " ", into.scalar_type(), " on ", into.device());
  }
  Pending pending;
  pending.op_ = "all_gather";
  const at::Device device = t.device();
  const at::ScalarType dtype = t.scalar_type();
  // The caller's result from the gathered wire tensor: `into` (filled, or copied into), or a new
  // tensor in t's device and dtype.
  const auto finish = [into, device, dtype](const at::Tensor& out) -> std::function<at::Tensor()> {
    if (!into.defined()) return [out, device, dtype] { return out.to(device, dtype); };
    return [out, into]() mutable { return out.is_same(into) ? into : into.copy_(out); };
  };
  if (!backend_) {
    pending.finish_ = finish(t.unsqueeze(0).clone(at::MemoryFormat::Contiguous));
    return pending;
  }
  pending.group_ = this;
  at::Tensor in = to_wire(t, device_, is_gloo_);
  // Into the caller's tensor when it is what goes on the wire (Gloo: rows of it; not for bf16,
  // which Gloo gathers in fp32).
  const bool direct =
      into.defined() && into.device() == device_ && into.scalar_type() == in.scalar_type();
  at::Tensor out = direct ? into : at::empty(out_shape, in.options());  // [size, ...]
  if (!is_gloo_) {  // NCCL: one flat buffer
    pending.work_ = start_work(pending.op_, [&] { return backend_->_allgather_base(out, in); });
    pending.wire_ = {{in}, {out}};
  } else {
    std::vector<at::Tensor> rows;
    for (int i = 0; i < size(); ++i) rows.push_back(out[i]);  // views
    pending.wire_ = {{in}, rows, {out}};
    std::vector<std::vector<at::Tensor>> outputs = {rows};
    pending.work_ = start_work(pending.op_,
                               [&] { return backend_->allgather(outputs, pending.wire_[0]); });
  }
  pending.finish_ = finish(out);
  return pending;
}

at::Tensor Group::reduce_scatter(const at::Tensor& input) {
  return reduce_scatter_start(input).wait();
}

Group::Pending Group::reduce_scatter_start(const at::Tensor& input) {
  TORCH_CHECK(input.dim() >= 1 && input.size(0) == size(), "reduce_scatter on group ", name_,
              ": input must have dim 0 == the group size ", size(), ", got shape ", input.sizes());
  Pending pending;
  pending.op_ = "reduce_scatter";
  if (!backend_) {
    at::Tensor out = input[0].clone(at::MemoryFormat::Contiguous);
    pending.finish_ = [out] { return out; };
    return pending;
  }
  pending.group_ = this;
  at::Tensor in = to_wire(input, device_, is_gloo_);  // [size, ...]
  at::Tensor out = at::empty_like(in[0]);            // [...]
  c10d::ReduceScatterOptions options;
  options.reduceOp = c10d::ReduceOp(c10d::ReduceOp::SUM);
  if (!is_gloo_) {  // NCCL: the flat buffer as it is (the list form copies it into a new one)
    pending.work_ = start_work(pending.op_, [&] {
      return backend_->_reduce_scatter_base(out, in, options);
    });
    pending.wire_ = {{in}, {out}};
  } else {
    std::vector<at::Tensor> rows;
    for (int i = 0; i < size(); ++i) rows.push_back(in[i]);  // contiguous views of in
    pending.wire_ = {{out}, rows};
    std::vector<std::vector<at::Tensor>> inputs = {rows};
    pending.work_ = start_work(pending.op_, [&] {
      return backend_->reduce_scatter(pending.wire_[0], inputs, options);
    });
  }
  const at::Device device = input.device();
  const at::ScalarType dtype = input.scalar_type();
  pending.finish_ = [out, device, dtype] { return out.to(device, dtype); };
  return pending;
}

Group::Pending Group::all_reduce_start(at::Tensor& t, ReduceOp op) {
  Pending pending;
  pending.op_ = "all_reduce";
  pending.finish_ = [t] { return t; };
  if (!backend_) return pending;
  pending.group_ = this;
  pending.wire_ = {{to_wire(t, device_, is_gloo_)}};
  c10d::AllreduceOptions options;
  options.reduceOp = to_c10d(op);
  pending.work_ =
      start_work(pending.op_, [&] { return backend_->allreduce(pending.wire_[0], options); });
  const at::Tensor wire = pending.wire_[0][0];
  if (!wire.is_same(t)) {
    pending.finish_ = [t, wire]() mutable { return t.copy_(wire); };
  }
  return pending;
}

at::Tensor Group::Pending::wait() {
  TORCH_CHECK(!waited_, "Group::Pending::wait: called twice");
  waited_ = true;
  if (group_ != nullptr) group_->wait_work(op_, work_);
  at::Tensor result = finish_();
  finish_ = nullptr;
  wire_.clear();
  return result;
}

void Group::broadcast(at::Tensor& t, int root) {
  TORCH_CHECK(root >= 0 && root < size(), "broadcast on group ", name_, ": root ", root,
              " is outside 0..", size() - 1);
  if (!backend_) return;
  std::vector<at::Tensor> tensors = {to_wire(t, device_, is_gloo_)};
  c10d::BroadcastOptions options;
  options.rootRank = root;
  run("broadcast", [&] { return backend_->broadcast(tensors, options); });
  if (!tensors[0].is_same(t)) t.copy_(tensors[0]);
}

void Group::barrier() {
  if (!backend_) return;
  if (device_.is_cuda()) {
    // NCCL's own barrier guesses the device; a one-element all-reduce on ours is explicit.
    std::vector<at::Tensor> tensors = {at::zeros({1}, at::TensorOptions().device(device_))};
    run("barrier", [&] { return backend_->allreduce(tensors); });
    tensors[0].cpu();  // the host waits for the device
    return;
  }
  run("barrier", [&] { return backend_->barrier(); });
}

}  // namespace ulysses::comm
