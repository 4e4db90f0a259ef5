// AdamW update and state (de)serialization; see adamw.h for the exact update rule.
#include "optim/adamw.h"

#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <vector>

#include "common/error.h"
#include "common/pinned_host.h"
#include "optim/adamw_aten.h"
#include "optim/cpu_adam.h"
#include "profile/phase_timer.h"

namespace ulysses::train {
namespace {

const char* const kExpAvg = ".exp_avg";
const char* const kExpAvgSq = ".exp_avg_sq";
const char* const kStep = ".step";
const char* const kMaster = ".master";

bool is_reduced(at::ScalarType dtype) { return dtype == at::kBFloat16 || dtype == at::kHalf; }

// A host buffer of `param`'s shape in `dtype`, page-locked (of its exact size) when a GPU copies
// into or out of it.
at::Tensor host_buffer(const at::Tensor& param, at::ScalarType dtype, bool pinned) {
  return zeros_on_host(param.sizes(), dtype, pinned);
}

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

AdamW::AdamW(NamedTensors params, const config::OptimOptions& options, OptimizerPlacement placement)
    : options_(options), placement_(placement) {
  check_options(options_);
  std::set<std::string> seen;
  slots_.reserve(params.size());
  for (auto& [name, param] : params) {
    TORCH_CHECK(seen.insert(name).second, "AdamW: duplicate parameter name '", name, "'");
    TORCH_CHECK(param.defined(), "AdamW: parameter '", name, "' is undefined");
    TORCH_CHECK(param.layout() == at::kStrided, "AdamW: parameter '", name, "' is not dense");
    const at::ScalarType dtype = param.scalar_type();
    TORCH_CHECK(dtype == at::kFloat || dtype == at::kDouble || is_reduced(dtype),
                "AdamW: parameter '", name, "' has dtype ", dtype,
                "; fp32, fp64, bf16 or fp16 required");
    Slot slot;
    slot.name = name;
    slot.param = param;
    const at::ScalarType master_dtype = dtype == at::kDouble ? at::kDouble : at::kFloat;
    at::NoGradGuard no_grad;
    if (placement_ == OptimizerPlacement::kHost) {
      if (param.device().is_cpu() && param.is_contiguous() && dtype == master_dtype) {
        slot.master = param;  // its own master: updated in place, nothing to copy back
      } else {
        slot.master = host_buffer(param, master_dtype, /*pinned=*/param.is_cuda());
        slot.master.copy_(param);
      }
    } else if (is_reduced(dtype)) {
      slot.master =
          param.detach().to(master_dtype, /*non_blocking=*/false, /*copy=*/true).contiguous();
    }
    const at::Tensor& updated = slot.master.defined() ? slot.master : param;
    slot.exp_avg = at::zeros_like(updated, at::MemoryFormat::Preserve);
    slot.exp_avg_sq = at::zeros_like(updated, at::MemoryFormat::Preserve);
    slots_.push_back(std::move(slot));
  }
}

void AdamW::step(double lr) {
  std::vector<at::Tensor> grads;
  grads.reserve(slots_.size());
  for (const Slot& slot : slots_) {
    grads.push_back(slot.param.grad());
  }
  step(lr, grads);
}

void AdamW::check_grad(const Slot& slot, const at::Tensor& grad) const {
  TORCH_CHECK(grad.layout() == at::kStrided, "AdamW: sparse gradient for '", slot.name, "'");
  const at::ScalarType param_dtype = slot.param.scalar_type();
  const bool dtype_ok = grad.scalar_type() == param_dtype ||
                        (is_reduced(param_dtype) && grad.scalar_type() == at::kFloat);
  // kHost also takes host gradients of device parameters (GradientBuffers with on_host) and device
  // gradients of host parameters (ZeRO's host masters).
  const bool device_ok =
      grad.device() == slot.param.device() ||
      (placement_ == OptimizerPlacement::kHost && (grad.is_cpu() || slot.param.is_cpu()));
  TORCH_CHECK(grad.sizes() == slot.param.sizes() && dtype_ok && device_ok,
              "AdamW: gradient of '", slot.name, "' has shape ", grad.sizes(), " dtype ",
              grad.scalar_type(), " device ", grad.device(), ", the parameter ",
              slot.param.sizes(), " ", param_dtype, " ", slot.param.device());
}

void AdamW::step(double lr, const std::vector<at::Tensor>& grads, double grad_scale) {
  TORCH_CHECK(lr >= 0.0, "AdamW::step: lr must be >= 0, got ", lr);
  TORCH_CHECK(std::isfinite(grad_scale) && grad_scale > 0.0,
              "AdamW::step: grad_scale must be finite and > 0, got ", grad_scale);
  TORCH_CHECK(grads.size() == slots_.size(), "AdamW::step: ", grads.size(),
              " gradients for ", slots_.size(), " parameters");
  for (size_t i = 0; i < slots_.size(); ++i) {  // all checks before any update
    if (grads[i].defined()) check_grad(slots_[i], grads[i]);
  }
  at::NoGradGuard no_grad;
  std::vector<Slot*> on_host;            // kHost: slots with a gradient this step
  std::vector<at::Tensor> host_sources;  // their gradients
  std::vector<FusedAdamWEntry> fused;    // kDevice on CUDA: updated by one multi-tensor call
  std::vector<Slot*> fused_slots;
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& slot = slots_[i];
    const at::Tensor& grad = grads[i];
    if (!grad.defined()) continue;
    if (placement_ == OptimizerPlacement::kHost) {
      if (grad.is_cuda()) start_host_copy(slot, grad);  // the others start meanwhile
      on_host.push_back(&slot);
      host_sources.push_back(grad);
      continue;
    }
    at::Tensor& weights = slot.master.defined() ? slot.master : slot.param;
    if (grad_scale == 1.0 && weights.is_cuda() &&
        fused_adamw_applies(weights, grad, slot.exp_avg, slot.exp_avg_sq)) {
      slot.step += 1;
      fused.push_back({weights, grad, slot.exp_avg, slot.exp_avg_sq, slot.step});
      fused_slots.push_back(&slot);
    } else {
      update_slot(slot, grad, lr, grad_scale);
    }
  }
  if (!fused.empty()) {
    adamw_fused_update_many(fused, lr, options_);
    for (Slot* slot : fused_slots) {
      if (slot->master.defined()) slot->param.copy_(slot->master);
    }
  }
  if (!on_host.empty()) {
    update_on_host(on_host, host_sources, lr, grad_scale);
  }
  ++step_count_;
}

void AdamW::start_host_copy(Slot& slot, const at::Tensor& grad) {
  if (!slot.host_grad.defined() || slot.host_grad.scalar_type() != grad.scalar_type()) {
    slot.host_grad = host_buffer(slot.param, grad.scalar_type(), /*pinned=*/true);
  }
  const c10::Device device = grad.device();
  const c10::impl::VirtualGuardImpl impl(device.type());
  auto stream = std::find_if(copy_streams_.begin(), copy_streams_.end(),
                             [&](const c10::Stream& s) { return s.device() == device; });
  if (stream == copy_streams_.end()) {
    copy_streams_.push_back(impl.getStreamFromGlobalPool(device, /*isHighPriority=*/false));
    stream = copy_streams_.end() - 1;
  }
  // The side stream waits for what the current stream has queued (the kernels producing grad,
  // and the previous step's copies out of the masters), then copies without blocking the host.
  c10::Event produced(device.type());
  produced.record(impl.getStream(device));
  stream->wait(produced);
  const c10::StreamGuard on_side_stream(*stream);
  slot.host_grad.copy_(grad, /*non_blocking=*/true);
  slot.staged = grad;  // keeps the source alive until step() has waited for the copy
}

void AdamW::update_slot(Slot& slot, const at::Tensor& grad, double lr, double grad_scale) {
  slot.step += 1;
  const at::ScalarType update_dtype =
      slot.master.defined() ? slot.master.scalar_type() : slot.param.scalar_type();
  at::Tensor g = grad.to(update_dtype);  // [param shape], grad itself when already that dtype
  if (grad_scale != 1.0) g = g.mul(grad_scale);  // a temporary: grad is never written
  at::Tensor& weights = slot.master.defined() ? slot.master : slot.param;
  // CUDA: one fused kernel per parameter (no temporaries); elsewhere, and where the kernel does not
  // apply, the ATen ops over pieces (the CPU results stay equal to the host kernel's bit for bit).
  if (weights.is_cuda() && fused_adamw_applies(weights, g, slot.exp_avg, slot.exp_avg_sq)) {
    adamw_fused_update(weights, g, slot.exp_avg, slot.exp_avg_sq, lr, slot.step, options_);
  } else {
    adamw_aten_update_in_pieces(weights, g, slot.exp_avg, slot.exp_avg_sq, lr, slot.step,
                                options_);
  }
  if (slot.master.defined()) slot.param.copy_(slot.master);
}

void AdamW::update_on_host(const std::vector<Slot*>& slots, const std::vector<at::Tensor>& grads,
                           double lr, double grad_scale) {
  if (!copy_streams_.empty()) {
    profile::ScopedPhase part("optimizer_download", profile::Category::kOptimizer);
    for (const c10::Stream& stream : copy_streams_) {
      stream.synchronize();  // every staged gradient is on the host
    }
  }
  std::vector<FusedAdamWBuffer> buffers;
  buffers.reserve(slots.size());
  std::vector<Slot*> direct;            // slots the pass writes, or copied from their master
  std::vector<Slot*> staged;            // slots whose converted weights go through staging
  std::vector<at::Tensor> staged_grads;
  for (size_t i = 0; i < slots.size(); ++i) {
    Slot& slot = *slots[i];
    slot.step += 1;
    const at::Tensor& grad = grads[i].is_cuda() ? slot.host_grad : grads[i];
    const bool own_master = slot.master.is_same(slot.param);
    const bool pass_writes = slot.param.device().is_cpu() && slot.param.is_contiguous() &&
                             !stage_host_parameters_;
    const bool same_dtype = slot.param.scalar_type() == slot.master.scalar_type();
    if (!own_master && !pass_writes && !(same_dtype && slot.param.is_contiguous())) {
      staged.push_back(&slot);
      staged_grads.push_back(grad.contiguous());
      continue;
    }
    direct.push_back(&slot);
    FusedAdamWBuffer buffer;
    buffer.master = slot.master;
    buffer.exp_avg = slot.exp_avg;
    buffer.exp_avg_sq = slot.exp_avg_sq;
    buffer.grad = grad.contiguous();
    if (!own_master && pass_writes) {
      buffer.param_out = slot.param;  // written by the pass itself
    }
    buffer.step = slot.step;
    buffers.push_back(std::move(buffer));
  }
  {
    profile::ScopedPhase part("optimizer_host_update", profile::Category::kOptimizer);
    fused_adamw_cpu(buffers, lr, options_, grad_scale);
  }
  {
    profile::ScopedPhase part("optimizer_upload", profile::Category::kOptimizer);
    for (size_t i = 0; i < direct.size(); ++i) {
      Slot& slot = *direct[i];
      if (slot.master.is_same(slot.param) || buffers[i].param_out.defined()) continue;
      // Same dtype: host -> device from pinned memory, queued on the current stream; the next
      // step's copies out wait for it (start_host_copy), so the next host update never races it.
      slot.param.copy_(slot.master, /*non_blocking=*/slot.param.is_cuda());
    }
  }
  if (!staged.empty()) update_through_staging(staged, staged_grads, lr, grad_scale);
  for (Slot* slot : slots) slot->staged = at::Tensor();
}

void AdamW::set_upload_staging_bytes(int64_t bytes, bool stage_host_parameters) {
  TORCH_CHECK(bytes >= 64, "AdamW: upload staging buffers of ", bytes, " bytes (64 at least)");
  for (size_t k = 0; k < 2; ++k) {
    wait_staging(k);
    staging_[k] = at::Tensor();
  }
  staging_bytes_ = bytes;
  stage_host_parameters_ = stage_host_parameters;
}

AdamW::~AdamW() {
  try {
    for (size_t k = 0; k < 2; ++k) wait_staging(k);  // nothing copies out of freed memory
  } catch (...) {
  }
}

void AdamW::wait_staging(size_t k) {
  for (c10::Event& copy : staging_copies_[k]) copy.synchronize();
  staging_copies_[k].clear();
}

void AdamW::update_through_staging(const std::vector<Slot*>& staged,
                                   const std::vector<at::Tensor>& grads, double lr,
                                   double grad_scale) {
  // A piece: elements [offset, offset + length) of one slot, whose converted weights the pass
  // writes at `byte` in the current staging buffer.
  struct Piece {
    Slot* slot;
    int64_t offset, length, byte;
    const at::Tensor* grad;
  };
  constexpr int64_t kAlign = 64;  // each piece starts on a cache line
  for (size_t k = 0; k < 2; ++k) wait_staging(k);  // the last step's copies (long done)
  size_t current = 0;             // the staging buffer being filled
  int64_t used = 0;               // its bytes taken
  std::vector<Piece> batch;
  const auto flush = [&] {
    if (batch.empty()) return;
    std::vector<FusedAdamWBuffer> buffers;
    buffers.reserve(batch.size());
    for (const Piece& p : batch) {
      const auto range = [&](const at::Tensor& t) { return t.view({-1}).narrow(0, p.offset, p.length); };
      FusedAdamWBuffer b;
      b.master = range(p.slot->master);
      b.exp_avg = range(p.slot->exp_avg);
      b.exp_avg_sq = range(p.slot->exp_avg_sq);
      b.grad = range(*p.grad);
      const int64_t bytes = p.length * static_cast<int64_t>(p.slot->param.element_size());
      b.param_out = staging_[current].narrow(0, p.byte, bytes).view(p.slot->param.scalar_type());
      b.step = p.slot->step;
      buffers.push_back(std::move(b));
    }
    {
      profile::ScopedPhase part("optimizer_host_update", profile::Category::kOptimizer);
      fused_adamw_cpu(buffers, lr, options_, grad_scale);
    }
    profile::ScopedPhase part("optimizer_upload", profile::Category::kOptimizer);
    for (size_t i = 0; i < batch.size(); ++i) {
      at::Tensor& param = batch[i].slot->param;
      if (param.is_contiguous()) {
        param.view({-1}).narrow(0, batch[i].offset, batch[i].length)
            .copy_(buffers[i].param_out, /*non_blocking=*/param.is_cuda());
      } else {  // whole (see below): a strided copy of the parameter's shape
        param.copy_(buffers[i].param_out.view(param.sizes()), /*non_blocking=*/param.is_cuda());
      }
      if (param.is_cuda()) {
        const c10::impl::VirtualGuardImpl impl(param.device().type());
        c10::Event copied(param.device().type());
        copied.record(impl.getStream(param.device()));
        staging_copies_[current].push_back(std::move(copied));
      }
    }
    batch.clear();
    current ^= 1;  // fill the other buffer while this one's copies run
    wait_staging(current);
    used = 0;
  };
  for (size_t s = 0; s < staged.size(); ++s) {
    Slot* slot = staged[s];
    const int64_t numel = slot->param.numel();
    const int64_t element = static_cast<int64_t>(slot->param.element_size());
    // A non-contiguous parameter is written whole; one larger than a buffer, from its master.
    if (!slot->param.is_contiguous() && numel * element > staging_bytes_) {
      profile::ScopedPhase part("optimizer_host_update", profile::Category::kOptimizer);
      fused_adamw_cpu({FusedAdamWBuffer{slot->master, slot->exp_avg, slot->exp_avg_sq,
                                        grads[s], at::Tensor(), slot->step}},
                      lr, options_, grad_scale);
      profile::ScopedPhase upload("optimizer_upload", profile::Category::kOptimizer);
      slot->param.copy_(slot->master);
      continue;
    }
    for (int64_t offset = 0; offset < numel;) {
      const int64_t room = (staging_bytes_ - used) / element;
      const int64_t left = numel - offset;
      if (room <= 0 || (!slot->param.is_contiguous() && room < left)) {
        flush();
        continue;
      }
      if (!staging_[current].defined()) {
        staging_[current] = zeros_on_host({staging_bytes_}, at::kByte, slot->param.is_cuda());
      }
      const int64_t length = std::min(room, left);
      batch.push_back({slot, offset, length, used, &grads[s]});
      used = std::min(staging_bytes_, (used + length * element + kAlign - 1) / kAlign * kAlign);
      offset += length;
    }
  }
  flush();
}

void AdamW::reload_parameters() {
  at::NoGradGuard no_grad;
  for (Slot& slot : slots_) {
    if (slot.master.defined()) slot.master.copy_(slot.param);
  }
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
    if (is_reduced(slot.param.scalar_type())) state.emplace_back(slot.name + kMaster, slot.master);
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
    const at::Tensor* master;  // null: re-read from the parameter
  };
  std::vector<Saved> saved;
  saved.reserve(slots_.size());
  // The entry of `state` under key (a pointer into it, kept in `saved`), marked as used.
  auto take = [&](const std::string& key) -> const at::Tensor* {
    auto it = unused.find(key);
    if (it == unused.end()) {
      throw UserError(c10::str(source, ": missing entry '", key, "'"));
    }
    const at::Tensor* tensor = it->second;
    unused.erase(it);
    return tensor;
  };
  for (const Slot& slot : slots_) {
    const at::Tensor* exp_avg = take(slot.name + kExpAvg);
    const at::Tensor* exp_avg_sq = take(slot.name + kExpAvgSq);
    const at::Tensor* step = take(slot.name + kStep);
    check_moment(source, slot.name + kExpAvg, *exp_avg, slot.exp_avg);
    check_moment(source, slot.name + kExpAvgSq, *exp_avg_sq, slot.exp_avg_sq);
    const at::Tensor* master = nullptr;
    auto master_entry = unused.find(slot.name + kMaster);
    if (is_reduced(slot.param.scalar_type()) && master_entry != unused.end()) {
      master = master_entry->second;
      check_moment(source, slot.name + kMaster, *master, slot.master);
      unused.erase(master_entry);
    }
    saved.push_back({exp_avg, exp_avg_sq, read_step(source, slot.name + kStep, *step), master});
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
    if (saved[i].master != nullptr) {
      slots_[i].master.copy_(*saved[i].master);
    } else if (slots_[i].master.defined()) {
      slots_[i].master.copy_(slots_[i].param);
    }
  }
  step_count_ = step_count;
}

}  // namespace ulysses::train
