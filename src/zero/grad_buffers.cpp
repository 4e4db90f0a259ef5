// fp32 gradient accumulation buffers and their bucketed reduction (see grad_buffers.h).
#include "zero/grad_buffers.h"

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <map>
#include <utility>

#include "profile/phase_timer.h"

namespace ulysses::train {
namespace {

at::ScalarType accumulation_dtype(at::ScalarType param_dtype) {
  return param_dtype == at::kDouble ? at::kDouble : at::kFloat;
}

// Runs after autograd has accumulated a contribution into a parameter's .grad() (half precision,
// or any parameter whose buffer is on the host): moves it into the fp32 buffer and releases it, so
// the next contribution starts from nothing.
struct AccumulateIntoMainGrad : public torch::autograd::PostAccumulateGradHook {
  explicit AccumulateIntoMainGrad(at::Tensor main_grad) : main_grad(std::move(main_grad)) {}
  void operator()(const torch::autograd::Variable& param) override {
    at::Tensor& grad = param.mutable_grad();
    if (!grad.defined()) return;
    if (grad.device() != main_grad.device()) {
      main_grad.add_(grad.to(main_grad.device()));  // device -> host in the grad's dtype, then add
    } else {
      main_grad.add_(grad);  // fp32 += bf16, converted element by element
    }
    grad.reset();
  }
  at::Tensor main_grad;  // [param shape] fp32 view of the flat buffer
};

}  // namespace

FlatLayout plan_flat_layout(const std::vector<at::Tensor>& params, int64_t shards) {
  TORCH_CHECK(shards >= 1, "GradientBuffers: shards must be >= 1, got ", shards);
  using Key = std::pair<std::string, at::ScalarType>;
  std::map<Key, int64_t> numel_of;
  for (const auto& p : params) {
    if (p.requires_grad()) numel_of[{p.device().str(), accumulation_dtype(p.scalar_type())}] += p.numel();
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
    auto& [index, offset] = cursor[{params[i].device().str(), accumulation_dtype(params[i].scalar_type())}];
    layout.flat_index[i] = index;
    layout.flat_offset[i] = offset;
    offset += params[i].numel();
  }
  return layout;
}

GradientBuffers::GradientBuffers(std::vector<at::Tensor> params, int64_t shards, bool on_host)
    : params_(std::move(params)), grads_(params_.size()), hooked_(params_.size(), false) {
  const FlatLayout layout = plan_flat_layout(params_, shards);
  flat_index_ = layout.flat_index;
  flat_offset_ = layout.flat_offset;
  for (size_t f = 0; f < layout.flat_numel.size(); ++f) flats_.push_back(at::Tensor());
  for (size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor& p = params_[i];
    if (!p.requires_grad()) continue;
    TORCH_CHECK(p.is_leaf(), "GradientBuffers: parameters must be leaf tensors");
    at::Tensor& flat = flats_[flat_index_[i]];
    if (!flat.defined()) {
      flat = at::zeros({layout.flat_numel[flat_index_[i]]},
                       at::TensorOptions()
                           .device(on_host ? at::Device(at::kCPU) : p.device())
                           .dtype(accumulation_dtype(p.scalar_type())));  // [padded]
      // Not pinned: nothing copies into it asynchronously, and the caching host allocator would
      // round a pinned block of this size up to a power of two (up to twice the memory).
    }
    grads_[i] = flat.narrow(0, flat_offset_[i], p.numel()).view(p.sizes());  // [param shape]
    if (!on_host && p.scalar_type() == grads_[i].scalar_type()) {
      p.mutable_grad() = grads_[i];
    } else {
      p.mutable_grad().reset();
      torch::autograd::impl::set_post_acc_grad_hooks(
          p, std::make_unique<AccumulateIntoMainGrad>(grads_[i]));
      hooked_[i] = true;
    }
  }
}

GradientBuffers::~GradientBuffers() {
  for (size_t i = 0; i < params_.size(); ++i) {
    if (hooked_[i]) torch::autograd::impl::set_post_acc_grad_hooks(params_[i], nullptr);
  }
}

void GradientBuffers::zero() {
  for (auto& flat : flats_) flat.zero_();
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!grads_[i].defined()) continue;
    if (hooked_[i]) {
      params_[i].mutable_grad().reset();
    } else if (!params_[i].grad().is_same(grads_[i])) {
      params_[i].mutable_grad() = grads_[i];
    }
  }
}

void GradientBuffers::all_reduce(comm::Group& group, int64_t bucket_bytes) {
  TORCH_CHECK(bucket_bytes >= 1, "GradientBuffers::all_reduce: bucket_bytes must be >= 1");
  if (group.size() == 1) return;
  profile::ScopedPhase phase("grad_sync");
  for (auto& flat : flats_) {
    const int64_t bucket_numel = std::max<int64_t>(bucket_bytes / flat.element_size(), 1);
    for (int64_t start = 0; start < flat.numel(); start += bucket_numel) {
      at::Tensor bucket = flat.narrow(0, start, std::min(bucket_numel, flat.numel() - start));
      group.all_reduce(bucket, comm::ReduceOp::kSum);  // contiguous slice, reduced in place
    }
  }
}

void GradientBuffers::copy_to_param_grads() {
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
