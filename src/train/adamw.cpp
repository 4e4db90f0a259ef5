// AdamW update and state (de)serialization; see adamw.h for the exact update rule.
#include "train/adamw.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <cmath>
#include <map>
#include <set>

#include "common/error.h"

namespace ulysses::train {
namespace {

const char* const kExpAvg = ".exp_avg";
const char* const kExpAvgSq = ".exp_avg_sq";
const char* const kStep = ".step";

void check_options(const config::OptimOptions& options) {
  if (!(options.lr >= 0.0)) {
    throw UserError(c10::str("optim.lr: must be >= 0, got ", options.lr));
  }
  for (double beta : options.betas) {
    if (!(beta >= 0.0 && beta < 1.0)) {
      throw UserError(c10::str("optim.betas: each beta must be in [0, 1), got ", beta));
    }
  }
  if (!(options.eps >= 0.0)) {
    throw UserError(c10::str("optim.eps: must be >= 0, got ", options.eps));
  }
  if (!(options.weight_decay >= 0.0)) {
    throw UserError(c10::str("optim.weight_decay: must be >= 0, got ", options.weight_decay));
  }
}

// Checks one saved moment tensor against the live one it will be copied into.
void check_moment(const std::string& source, const std::string& key, const at::Tensor& saved,
                  const at::Tensor& live) {
  if (!saved.defined()) {
    throw UserError(c10::str(source, ": entry '", key, "' is an undefined tensor"));
  }
  if (saved.sizes() != live.sizes()) {
    throw UserError(c10::str(source, ": entry '", key, "' has shape ", saved.sizes(),
                             ", the parameter has shape ", live.sizes()));
  }
  if (saved.scalar_type() != live.scalar_type()) {
    throw UserError(c10::str(source, ": entry '", key, "' has dtype ", saved.scalar_type(),
                             ", the parameter has dtype ", live.scalar_type()));
  }
}

// Reads a saved per-parameter step: a one-element integer tensor holding a value >= 0.
int64_t read_step(const std::string& source, const std::string& key, const at::Tensor& saved) {
  if (!saved.defined() || saved.numel() != 1 ||
      !at::isIntegralType(saved.scalar_type(), /*includeBool=*/false)) {
    throw UserError(c10::str(source, ": entry '", key, "' must be a one-element integer tensor"));
  }
  const int64_t step = saved.item<int64_t>();
  if (step < 0) {
    throw UserError(c10::str(source, ": entry '", key, "' is negative (", step, ")"));
  }
  return step;
}

}  // namespace

AdamW::AdamW(NamedTensors params, const config::OptimOptions& options) : options_(options) {
  check_options(options_);
  std::set<std::string> seen;
  slots_.reserve(params.size());
  for (auto& [name, param] : params) {
    TORCH_CHECK(seen.insert(name).second, "AdamW: duplicate parameter name '", name, "'");
    TORCH_CHECK(param.defined(), "AdamW: parameter '", name, "' is undefined");
    TORCH_CHECK(param.layout() == at::kStrided, "AdamW: parameter '", name, "' is not dense");
    TORCH_CHECK(param.scalar_type() == at::kFloat || param.scalar_type() == at::kDouble,
                "AdamW: parameter '", name, "' has dtype ", param.scalar_type(),
                "; fp32 or fp64 required (bf16 needs an fp32 master copy, not built yet)");
    Slot slot;
    slot.name = name;
    slot.param = param;
    slot.exp_avg = at::zeros_like(param, at::MemoryFormat::Preserve);
    slot.exp_avg_sq = at::zeros_like(param, at::MemoryFormat::Preserve);
    slots_.push_back(std::move(slot));
  }
}

void AdamW::step(double lr) {
  TORCH_CHECK(lr >= 0.0, "AdamW::step: lr must be >= 0, got ", lr);
  at::NoGradGuard no_grad;
  for (Slot& slot : slots_) {
    const at::Tensor& grad = slot.param.grad();
    if (!grad.defined()) {
      continue;
    }
    TORCH_CHECK(grad.layout() == at::kStrided, "AdamW: sparse gradient for '", slot.name, "'");
    TORCH_CHECK(
        grad.sizes() == slot.param.sizes() && grad.scalar_type() == slot.param.scalar_type(),
        "AdamW: gradient of '", slot.name, "' has shape ", grad.sizes(), " dtype ",
        grad.scalar_type(), ", the parameter ", slot.param.sizes(), " ", slot.param.scalar_type());
    update_slot(slot, grad, lr);
  }
  ++step_count_;
}

// Mirrors torch::optim::AdamW::step (LibTorch 1.13 and 2.x) op for op, in the same order.
void AdamW::update_slot(Slot& slot, const at::Tensor& grad, double lr) {
  at::Tensor& weights = slot.param;  // the fp32 master copy goes here once bf16 params exist
  const double beta1 = options_.betas[0];
  const double beta2 = options_.betas[1];

  if (options_.weight_decay != 0.0) {
    weights.mul_(1.0 - lr * options_.weight_decay);
  }

  slot.step += 1;
  const double bias_correction1 = 1.0 - std::pow(beta1, static_cast<double>(slot.step));
  const double bias_correction2 = 1.0 - std::pow(beta2, static_cast<double>(slot.step));

  slot.exp_avg.mul_(beta1).add_(grad, 1.0 - beta1);
  slot.exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1.0 - beta2);

  const at::Tensor denom =
      (slot.exp_avg_sq.sqrt() / std::sqrt(bias_correction2)).add_(options_.eps);
  const double step_size = lr / bias_correction1;
  weights.addcdiv_(slot.exp_avg, denom, -step_size);
}

std::vector<at::Tensor> AdamW::parameters() const {
  std::vector<at::Tensor> params;
  params.reserve(slots_.size());
  for (const Slot& slot : slots_) {
    params.push_back(slot.param);
  }
  return params;
}

NamedTensors AdamW::state_tensors() const {
  NamedTensors state;
  state.reserve(3 * slots_.size());
  for (const Slot& slot : slots_) {
    state.emplace_back(slot.name + kExpAvg, slot.exp_avg);
    state.emplace_back(slot.name + kExpAvgSq, slot.exp_avg_sq);
    state.emplace_back(slot.name + kStep, at::scalar_tensor(slot.step, at::kLong));
  }
  return state;
}

void AdamW::load_state(const NamedTensors& state, int64_t step_count, const std::string& source) {
  if (step_count < 0) {
    throw UserError(c10::str(source, ": step count is negative (", step_count, ")"));
  }
  std::map<std::string, const at::Tensor*> unused;  // entries not yet matched to a parameter
  for (const auto& [key, tensor] : state) {
    if (!unused.emplace(key, &tensor).second) {
      throw UserError(c10::str(source, ": entry '", key, "' appears twice"));
    }
  }
  // Validate everything first, remembering what to copy, so a bad state changes nothing.
  struct Saved {
    const at::Tensor* exp_avg;
    const at::Tensor* exp_avg_sq;
    int64_t step;
  };
  std::vector<Saved> saved;
  saved.reserve(slots_.size());
  auto take = [&](const std::string& key) -> const at::Tensor& {
    auto it = unused.find(key);
    if (it == unused.end()) {
      throw UserError(c10::str(source, ": missing entry '", key, "'"));
    }
    const at::Tensor* tensor = it->second;
    unused.erase(it);
    return *tensor;
  };
  for (const Slot& slot : slots_) {
    const at::Tensor& exp_avg = take(slot.name + kExpAvg);
    const at::Tensor& exp_avg_sq = take(slot.name + kExpAvgSq);
    const at::Tensor& step = take(slot.name + kStep);
    check_moment(source, slot.name + kExpAvg, exp_avg, slot.exp_avg);
    check_moment(source, slot.name + kExpAvgSq, exp_avg_sq, slot.exp_avg_sq);
    saved.push_back({&exp_avg, &exp_avg_sq, read_step(source, slot.name + kStep, step)});
  }
  if (!unused.empty()) {
    throw UserError(c10::str(source, ": unexpected entry '", unused.begin()->first,
                             "' (no such parameter in this model)"));
  }
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < slots_.size(); ++i) {
    slots_[i].exp_avg.copy_(*saved[i].exp_avg);
    slots_[i].exp_avg_sq.copy_(*saved[i].exp_avg_sq);
    slots_[i].step = saved[i].step;
  }
  step_count_ = step_count;
}

}  // namespace ulysses::train
