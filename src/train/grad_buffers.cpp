// fp32 gradient accumulation buffers and their bucketed reduction (see grad_buffers.h).
#include "train/grad_buffers.h"

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <map>
#include <tuple>
#include <utility>

#include "profile/phase_timer.h"

namespace ulysses::train {
namespace {

at::ScalarType accumulation_dtype(at::ScalarType param_dtype) {
  return param_dtype == at::kDouble ? at::kDouble : at::kFloat;
}

// Runs after autograd has accumulated a contribution into a half-precision parameter's .grad():
// moves it into the fp32 buffer and releases it, so the next contribution starts from nothing.
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

GradientBuffers::GradientBuffers(std::vector<at::Tensor> params, int64_t shards)
    : params_(std::move(params)),
      grads_(params_.size()),
      hooked_(params_.size(), false),
      flat_index_(params_.size(), -1),
      flat_offset_(params_.size(), 0) {
  TORCH_CHECK(shards >= 1, "GradientBuffers: shards must be >= 1, got ", shards);
  // Sizes per (device, dtype) first, then one allocation each, then the views.
  std::map<std::pair<std::string, at::ScalarType>, int64_t> numel_of;
  for (const auto& p : params_) {
    if (!p.requires_grad()) continue;
    TORCH_CHECK(p.is_leaf(), "GradientBuffers: parameters must be leaf tensors");
    numel_of[{p.device().str(), accumulation_dtype(p.scalar_type())}] += p.numel();
  }
  std::map<std::pair<std::string, at::ScalarType>, std::tuple<at::Tensor, int64_t, int>> flat_of;
  for (const auto& [key, numel] : numel_of) {
    const int64_t padded = (numel + shards - 1) / shards * shards;
    at::Tensor flat = at::zeros({padded}, at::TensorOptions()
                                             .device(at::Device(key.first))
                                             .dtype(key.second));  // [padded]
    flat_of[key] = {flat, 0, static_cast<int>(flats_.size())};
    flats_.push_back(flat);
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor& p = params_[i];
    if (!p.requires_grad()) continue;
    auto& [flat, offset, index] = flat_of[{p.device().str(), accumulation_dtype(p.scalar_type())}];
    grads_[i] = flat.narrow(0, offset, p.numel()).view(p.sizes());  // [param shape]
    flat_index_[i] = index;
    flat_offset_[i] = offset;
    offset += p.numel();
    if (p.scalar_type() == grads_[i].scalar_type()) {
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
    params_[i].mutable_grad() = grads_[i].to(params_[i].scalar_type());
  }
}

int64_t GradientBuffers::bytes() const {
  int64_t total = 0;
  for (const auto& flat : flats_) total += flat.numel() * flat.element_size();
  return total;
}

}  // namespace ulysses::train
