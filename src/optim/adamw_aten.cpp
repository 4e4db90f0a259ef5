// AdamW as ATen ops (kDevice update, test reference, benchmark baseline); see adamw_aten.h.
#include "optim/adamw_aten.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>

namespace ulysses::train {
namespace {

// Elements per work item of the chunked update: a multiple of 64, so that ATen's vector/tail
// split of each chunk lines up with that of a whole tensor.
constexpr int64_t kAtenChunk = 64 * 1024;

}  // namespace

void adamw_aten_update(at::Tensor weights, const at::Tensor& grad, at::Tensor exp_avg,
                       at::Tensor exp_avg_sq, double lr, int64_t step,
                       const config::OptimOptions& o) {
  const double beta1 = o.betas[0];
  const double beta2 = o.betas[1];
  if (o.weight_decay != 0.0) {
    weights.mul_(1.0 - lr * o.weight_decay);
  }
  const double bias_correction1 = 1.0 - std::pow(beta1, static_cast<double>(step));
  const double bias_correction2 = 1.0 - std::pow(beta2, static_cast<double>(step));

  exp_avg.mul_(beta1).add_(grad, 1.0 - beta1);
  exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1.0 - beta2);

  const at::Tensor denom = (exp_avg_sq.sqrt() / std::sqrt(bias_correction2)).add_(o.eps);
  const double step_size = lr / bias_correction1;
  weights.addcdiv_(exp_avg, denom, -step_size);
}

void adamw_aten_update_in_pieces(at::Tensor weights, const at::Tensor& grad, at::Tensor exp_avg,
                                 at::Tensor exp_avg_sq, double lr, int64_t step,
                                 const config::OptimOptions& options) {
  const int64_t numel = weights.numel();
  const bool flat = weights.is_contiguous() && grad.is_contiguous() && exp_avg.is_contiguous() &&
                    exp_avg_sq.is_contiguous();
  if (!flat || numel <= kDevicePiece) {
    adamw_aten_update(weights, grad, exp_avg, exp_avg_sq, lr, step, options);
    return;
  }
  for (int64_t offset = 0; offset < numel; offset += kDevicePiece) {
    const int64_t length = std::min(kDevicePiece, numel - offset);
    auto piece = [&](const at::Tensor& t) { return t.view({-1}).narrow(0, offset, length); };
    adamw_aten_update(piece(weights), piece(grad), piece(exp_avg), piece(exp_avg_sq), lr, step,
                      options);
  }
}

bool fused_adamw_applies(const at::Tensor& weights, const at::Tensor& grad,
                         const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq) {
  const at::ScalarType dtype = weights.scalar_type();
  const bool floating = dtype == at::kFloat || dtype == at::kDouble || dtype == at::kBFloat16 ||
                        dtype == at::kHalf;
  for (const at::Tensor* t : {&weights, &grad, &exp_avg, &exp_avg_sq}) {
    if (t->scalar_type() != dtype || t->device() != weights.device() || !t->is_contiguous()) {
      return false;
    }
  }
  return floating;
}

void adamw_fused_update(at::Tensor weights, const at::Tensor& grad, at::Tensor exp_avg,
                        at::Tensor exp_avg_sq, double lr, int64_t step,
                        const config::OptimOptions& o) {
  TORCH_CHECK(fused_adamw_applies(weights, grad, exp_avg, exp_avg_sq),
              "adamw_fused_update: tensors of different dtypes, devices or not contiguous");
  // The kernel reads the (already incremented) step from a float tensor on the device.
  const at::Tensor steps =
      at::full({}, static_cast<double>(step), at::TensorOptions(at::kFloat).device(weights.device()));
  at::_fused_adamw_({weights}, {grad}, {exp_avg}, {exp_avg_sq}, /*max_exp_avg_sqs=*/{}, {steps},
                    lr, o.betas[0], o.betas[1], o.weight_decay, o.eps, /*amsgrad=*/false,
                    /*maximize=*/false);
}

void adamw_fused_update_many(const std::vector<FusedAdamWEntry>& entries, double lr,
                             const config::OptimOptions& o) {
  // Groups in order of first appearance: (device, dtype) -> entries.
  std::vector<std::vector<const FusedAdamWEntry*>> groups;
  for (const FusedAdamWEntry& e : entries) {
    TORCH_CHECK(fused_adamw_applies(e.weights, e.grad, e.exp_avg, e.exp_avg_sq),
                "adamw_fused_update_many: tensors of different dtypes, devices or not contiguous");
    auto group = std::find_if(groups.begin(), groups.end(), [&](const auto& g) {
      return g.front()->weights.device() == e.weights.device() &&
             g.front()->weights.scalar_type() == e.weights.scalar_type();
    });
    if (group == groups.end()) {
      groups.emplace_back();
      group = groups.end() - 1;
    }
    group->push_back(&e);
  }
  for (const auto& group : groups) {
    const c10::Device device = group.front()->weights.device();
    // The kernel reads each (already incremented) step from a float tensor on the device: one
    // host tensor of them all, one copy, a view per parameter.
    at::Tensor host_steps = at::empty({static_cast<int64_t>(group.size())}, at::kFloat);
    std::vector<at::Tensor> weights, grads, exp_avgs, exp_avg_sqs;
    for (size_t i = 0; i < group.size(); ++i) {
      host_steps[static_cast<int64_t>(i)] = static_cast<double>(group[i]->step);
      weights.push_back(group[i]->weights);
      grads.push_back(group[i]->grad);
      exp_avgs.push_back(group[i]->exp_avg);
      exp_avg_sqs.push_back(group[i]->exp_avg_sq);
    }
    const at::Tensor steps = host_steps.to(device);  // [n]
    std::vector<at::Tensor> step_views;
    for (size_t i = 0; i < group.size(); ++i) step_views.push_back(steps[static_cast<int64_t>(i)]);
    at::_fused_adamw_(weights, grads, exp_avgs, exp_avg_sqs, /*max_exp_avg_sqs=*/{}, step_views,
                      lr, o.betas[0], o.betas[1], o.weight_decay, o.eps, /*amsgrad=*/false,
                      /*maximize=*/false);
  }
}

void adamw_aten_chunked_update(const std::vector<AtenHostBuffer>& buffers, double lr,
                               const config::OptimOptions& options) {
  struct Chunk {
    const AtenHostBuffer* buffer;
    int64_t offset, length;
  };
  std::vector<Chunk> chunks;
  for (const AtenHostBuffer& buffer : buffers) {
    const int64_t numel = buffer.master.numel();
    for (int64_t offset = 0; offset < numel; offset += kAtenChunk) {
      chunks.push_back({&buffer, offset, std::min(kAtenChunk, numel - offset)});
    }
  }
  at::parallel_for(0, static_cast<int64_t>(chunks.size()), 1, [&](int64_t begin, int64_t end) {
    at::NoGradGuard no_grad;  // grad mode is thread-local
    for (int64_t i = begin; i < end; ++i) {
      const Chunk& c = chunks[static_cast<size_t>(i)];
      auto part = [&](const at::Tensor& t) { return t.view({-1}).narrow(0, c.offset, c.length); };
      adamw_aten_update(part(c.buffer->master), part(c.buffer->grad), part(c.buffer->exp_avg),
                        part(c.buffer->exp_avg_sq), lr, c.buffer->step, options);
    }
  });
}

}  // namespace ulysses::train
