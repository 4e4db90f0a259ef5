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
#include <optional>
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

UploadStats& UploadStats::operator+=(const UploadStats& other) {
  staged += other.staged;
  staged_bytes += other.staged_bytes;
  direct += other.direct;
  direct_bytes += other.direct_bytes;
  blocking += other.blocking;
  blocking_bytes += other.blocking_bytes;
  return *this;
}

AdamW::AdamW(NamedTensors params, const config::OptimOptions& options, OptimizerPlacement placement,
             std::vector<at::Tensor> masters, AdamWStates states)
    : options_(options), placement_(placement), states_(states) {
  check_options(options_);
  const bool in_param_dtype = states_ == AdamWStates::kParameterDtype;
  TORCH_CHECK(!in_param_dtype || (placement_ == OptimizerPlacement::kDevice && masters.empty()),
              "AdamW: states in the parameters' dtype need kDevice and no masters");
  TORCH_CHECK(masters.empty() || (placement_ == OptimizerPlacement::kHost &&
                                  masters.size() == params.size()),
              "AdamW: the caller's masters need kHost and one master per parameter");
  std::set<std::string> seen;
  slots_.reserve(params.size());
  for (size_t index = 0; index < params.size(); ++index) {
    const auto& [name, param] = params[index];
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
    if (!masters.empty()) {
      const at::Tensor& master = masters[index];
      TORCH_CHECK(master.is_cpu() && master.is_contiguous() &&
                      master.scalar_type() == master_dtype && master.sizes() == param.sizes(),
                  "AdamW: the master of '", name, "' must be a contiguous host tensor of shape ",
                  param.sizes(), " and dtype ", master_dtype, ", got ", master.sizes(), " ",
                  master.scalar_type(), " ", master.device());
      slot.master = master;
      slot.own_master = false;
    } else if (placement_ == OptimizerPlacement::kHost) {
      if (param.device().is_cpu() && param.is_contiguous() && dtype == master_dtype) {
        slot.master = param;  // its own master: updated in place, nothing to copy back
      } else {
        slot.master = host_buffer(param, master_dtype, /*pinned=*/param.is_cuda());
        slot.master.copy_(param);
      }
    } else if (in_param_dtype) {
      TORCH_CHECK(param.is_contiguous(), "AdamW: parameter '", name,
                  "' is not contiguous (the fused update of states in its dtype needs it)");
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
  if (states_ == AdamWStates::kParameterDtype) {
    TORCH_CHECK(fused_adamw_applies(slot.param, grad, slot.exp_avg, slot.exp_avg_sq),
                "AdamW: gradient of '", slot.name, "' has shape ", grad.sizes(), " dtype ",
                grad.scalar_type(), " device ", grad.device(), " contiguous ",
                grad.is_contiguous(), ", needs the parameter's ", slot.param.sizes(), " ",
                param_dtype, " ", slot.param.device(), ", contiguous");
    TORCH_CHECK(grad.sizes() == slot.param.sizes(), "AdamW: gradient of '", slot.name,
                "' has shape ", grad.sizes(), ", the parameter ", slot.param.sizes());
    return;
  }
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
  const bool in_param_dtype = states_ == AdamWStates::kParameterDtype;
  TORCH_CHECK(!in_param_dtype || grad_scale == 1.0,
              "AdamW::step: states in the parameters' dtype take grad_scale 1 (clip first), got ",
              grad_scale);
  for (size_t i = 0; i < slots_.size(); ++i) {  // all checks before any update
    if (grads[i].defined()) check_grad(slots_[i], grads[i]);
  }
  at::NoGradGuard no_grad;
  last_uploads_ = UploadStats();
  std::vector<Slot*> on_host;            // kHost: slots with a gradient this step
  std::vector<at::Tensor> host_sources;  // their gradients
  std::vector<FusedAdamWEntry> fused;    // kDevice on CUDA: updated by one multi-tensor call
  std::vector<Slot*> fused_slots;
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& slot = slots_[i];
    const at::Tensor& grad = grads[i];
    if (!grad.defined()) continue;
    if (placement_ == OptimizerPlacement::kHost) {
      on_host.push_back(&slot);
      host_sources.push_back(grad);
      continue;
    }
    at::Tensor& weights = slot.master.defined() ? slot.master : slot.param;
    // kParameterDtype: every parameter, on any device (check_grad made sure the kernel applies).
    if (grad_scale == 1.0 && (weights.is_cuda() || in_param_dtype) &&
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
  std::vector<at::Tensor> contiguous;
  contiguous.reserve(grads.size());
  for (size_t i = 0; i < slots.size(); ++i) {
    slots[i]->step += 1;
    contiguous.push_back(grads[i].contiguous());
  }
  if (!slots.empty()) update_streamed(slots, contiguous, lr, grad_scale);
}

bool AdamW::upload_needs_staging(const Slot& slot) const {
  if (slot.master.is_same(slot.param)) return false;                     // updated in place
  if (slot.param.is_cpu() && slot.param.is_contiguous()) return false;  // the pass writes it
  return slot.param.scalar_type() != slot.master.scalar_type() || !slot.param.is_contiguous();
}

void AdamW::set_upload_staging_bytes(int64_t bytes, bool stage_host_parameters) {
  TORCH_CHECK(bytes >= 64, "AdamW: staging buffers of ", bytes, " bytes (64 at least)");
  for (size_t k = 0; k < 2; ++k) {
    wait_staging(k);
    staging_[k] = at::Tensor();
    downloads_[k] = at::Tensor();
  }
  staging_bytes_ = bytes;
  stage_host_parameters_ = stage_host_parameters;
}

AdamW::~AdamW() {
  try {
    for (size_t k = 0; k < 2; ++k) wait_staging(k);  // nothing copies out of freed memory
    for (c10::Event& copy : master_copies_) copy.synchronize();
    copy_streams_.synchronize();  // nor into it
  } catch (...) {
  }
}

void AdamW::wait_staging(size_t k) {
  for (c10::Event& copy : staging_copies_[k]) copy.synchronize();
  staging_copies_[k].clear();
}

void AdamW::update_streamed(const std::vector<Slot*>& slots, const std::vector<at::Tensor>& grads,
                            double lr, double grad_scale) {
  // A piece: elements [offset, offset + length) of one slot. Its gradient comes from `down` bytes
  // into the batch's download buffer (device gradients) or from where it is; its converted
  // weights go to `up` bytes into the batch's staging buffer (upload_needs_staging) or where the
  // direct path puts them.
  struct Piece {
    Slot* slot;
    const at::Tensor* grad;
    int64_t offset, length;
    int64_t down = -1, up = -1;  // -1: not through that buffer
  };
  constexpr int64_t kAlign = 64;  // each piece starts on a cache line
  const auto aligned = [&](int64_t bytes) {
    return std::min(staging_bytes_, (bytes + kAlign - 1) / kAlign * kAlign);
  };
  // Batches of pieces that fit one download and one staging buffer each, in slot order.
  std::vector<std::vector<Piece>> batches(1);
  int64_t down_used = 0, up_used = 0;
  std::vector<size_t> whole;  // slots too large for a buffer that cannot go in pieces
  for (size_t s = 0; s < slots.size(); ++s) {
    Slot* slot = slots[s];
    const bool download = grads[s].is_cuda() || stage_host_parameters_;
    const bool upload = upload_needs_staging(*slot) ||
                        (stage_host_parameters_ && !slot->master.is_same(slot->param));
    const int64_t numel = slot->param.numel();
    const int64_t grad_size = static_cast<int64_t>(grads[s].element_size());
    const int64_t param_size = static_cast<int64_t>(slot->param.element_size());
    const bool pieces_ok = slot->param.is_contiguous();  // else the parameter goes whole
    if (!pieces_ok && numel * std::max(grad_size, param_size) > staging_bytes_) {
      whole.push_back(s);
      continue;
    }
    for (int64_t offset = 0; offset < numel;) {
      const int64_t left = numel - offset;
      int64_t room = left;
      if (download) room = std::min(room, (staging_bytes_ - down_used) / grad_size);
      if (upload) room = std::min(room, (staging_bytes_ - up_used) / param_size);
      if (room <= 0 || (!pieces_ok && room < left)) {
        batches.emplace_back();
        down_used = up_used = 0;
        continue;
      }
      Piece piece{slot, &grads[s], offset, room};
      if (download) {
        piece.down = down_used;
        down_used = aligned(down_used + room * grad_size);
      }
      if (upload) {
        piece.up = up_used;
        up_used = aligned(up_used + room * param_size);
      }
      batches.back().push_back(piece);
      offset += room;
    }
  }
  const auto range = [](const at::Tensor& t, const Piece& p) {
    return t.reshape({-1}).narrow(0, p.offset, p.length);  // a view: t is contiguous
  };
  const auto bytes_as = [](const at::Tensor& buffer, int64_t byte, int64_t n, at::ScalarType dtype) {
    return buffer.narrow(0, byte, n * static_cast<int64_t>(c10::elementSize(dtype))).view(dtype);
  };
  // Device gradients are copied on a side stream that first waits for what the current stream
  // has queued (the kernels producing them, and the last step's copies out of these buffers).
  for (const at::Tensor& g : grads) {
    if (!g.is_cuda()) continue;
    const c10::impl::VirtualGuardImpl impl(g.device().type());
    c10::Event produced(g.device().type());
    produced.record(impl.getStream(g.device()));
    copy_streams_.get(g.device()).wait(produced);
  }
  std::vector<c10::Event> downloaded[2];  // per download buffer: its copies in flight
  const auto start_downloads = [&](size_t b) {
    const size_t k = b % 2;
    for (const Piece& p : batches[b]) {
      if (p.down < 0) continue;
      const at::Tensor& g = *p.grad;
      if (!downloads_[k].defined()) {
        downloads_[k] = zeros_on_host({staging_bytes_}, at::kByte, /*pinned=*/g.is_cuda());
      }
      at::Tensor into = bytes_as(downloads_[k], p.down, p.length, g.scalar_type());
      if (!g.is_cuda()) {
        into.copy_(range(g, p));
        continue;
      }
      const c10::Stream side = copy_streams_.get(g.device());
      {
        const c10::StreamGuard on_side(side);
        into.copy_(range(g, p), /*non_blocking=*/true);
      }
      c10::Event copied(g.device().type());
      copied.record(side);
      downloaded[k].push_back(std::move(copied));
    }
  };
  for (size_t k = 0; k < 2; ++k) wait_staging(k);  // the last step's copies (long done)
  for (c10::Event& copy : master_copies_) copy.synchronize();  // nothing rewrites their source
  master_copies_.clear();
  if (!batches.front().empty()) start_downloads(0);
  for (size_t b = 0; b < batches.size(); ++b) {
    if (batches[b].empty()) continue;
    const size_t k = b % 2;
    if (b + 1 < batches.size()) start_downloads(b + 1);  // while this batch updates
    {
      std::optional<profile::ScopedPhase> part;
      if (time_phases_) part.emplace("optimizer_download", profile::Category::kOptimizer);
      for (c10::Event& copied : downloaded[k]) copied.synchronize();
      downloaded[k].clear();
      wait_staging(k);  // the copies out of this staging buffer two batches ago
    }
    std::vector<FusedAdamWBuffer> buffers;
    buffers.reserve(batches[b].size());
    for (const Piece& p : batches[b]) {
      Slot& slot = *p.slot;
      FusedAdamWBuffer u;
      u.master = range(slot.master, p);
      u.exp_avg = range(slot.exp_avg, p);
      u.exp_avg_sq = range(slot.exp_avg_sq, p);
      u.grad = p.down >= 0 ? bytes_as(downloads_[k], p.down, p.length, p.grad->scalar_type())
                           : range(*p.grad, p);
      if (p.up >= 0) {
        if (!staging_[k].defined()) {
          staging_[k] = zeros_on_host({staging_bytes_}, at::kByte, slot.param.is_cuda());
        }
        u.param_out = bytes_as(staging_[k], p.up, p.length, slot.param.scalar_type());
      } else if (!slot.master.is_same(slot.param) && slot.param.is_cpu() &&
                 slot.param.is_contiguous()) {
        u.param_out = range(slot.param, p);
      }
      u.step = slot.step;
      buffers.push_back(std::move(u));
    }
    {
      std::optional<profile::ScopedPhase> part;
      if (time_phases_) part.emplace("optimizer_host_update", profile::Category::kOptimizer);
      fused_adamw_cpu(buffers, lr, options_, grad_scale);
    }
    std::optional<profile::ScopedPhase> part;
    if (time_phases_) part.emplace("optimizer_upload", profile::Category::kOptimizer);
    for (size_t i = 0; i < batches[b].size(); ++i) {
      const Piece& p = batches[b][i];
      at::Tensor& param = p.slot->param;
      at::Tensor from;  // what goes into the parameter's range, or undefined
      if (p.up >= 0) {
        from = buffers[i].param_out;
      } else if (!p.slot->master.is_same(param) && !buffers[i].param_out.defined()) {
        from = range(p.slot->master, p);  // the same dtype, from pinned memory
      }
      if (!from.defined()) continue;
      const int64_t bytes = p.length * static_cast<int64_t>(param.element_size());
      if (p.up >= 0) {
        last_uploads_.staged += 1;
        last_uploads_.staged_bytes += bytes;
      } else {
        last_uploads_.direct += 1;
        last_uploads_.direct_bytes += bytes;
      }
      if (param.is_contiguous()) {
        range(param, p).copy_(from, /*non_blocking=*/param.is_cuda());
      } else {  // whole (see above): a strided copy of the parameter's shape
        param.copy_(from.view(param.sizes()), /*non_blocking=*/param.is_cuda());
      }
      if (param.is_cuda()) {
        const c10::impl::VirtualGuardImpl impl(param.device().type());
        c10::Event copied(param.device().type());
        copied.record(impl.getStream(param.device()));
        // A copy out of a staging buffer holds it until done; one out of the master, only the
        // next pass over it.
        (p.up >= 0 ? staging_copies_[k] : master_copies_).push_back(std::move(copied));
      }
    }
  }
  // Non-contiguous parameters larger than a buffer: their gradient whole on the host, the pass
  // over the master, then a strided copy (none in the models this stack builds). (A parameter is
  // its own master only when contiguous.)
  for (size_t s : whole) {
    Slot* slot = slots[s];
    const at::Tensor grad = grads[s].to(at::kCPU);
    {
      std::optional<profile::ScopedPhase> part;
      if (time_phases_) part.emplace("optimizer_host_update", profile::Category::kOptimizer);
      fused_adamw_cpu({FusedAdamWBuffer{slot->master, slot->exp_avg, slot->exp_avg_sq, grad,
                                        at::Tensor(), slot->step}},
                      lr, options_, grad_scale);
    }
    std::optional<profile::ScopedPhase> upload;
    if (time_phases_) upload.emplace("optimizer_upload", profile::Category::kOptimizer);
    slot->param.copy_(slot->master);
    last_uploads_.blocking += 1;
    last_uploads_.blocking_bytes +=
        slot->param.numel() * static_cast<int64_t>(slot->param.element_size());
  }
}

void AdamW::begin_ahead() {
  TORCH_CHECK(placement_ == OptimizerPlacement::kHost, "AdamW::begin_ahead: kHost only");
  for (Slot& slot : slots_) slot.ahead = false;
  last_uploads_ = UploadStats();
}

void AdamW::update_ahead(const std::vector<size_t>& indices, const std::vector<at::Tensor>& grads,
                         double lr) {
  TORCH_CHECK(placement_ == OptimizerPlacement::kHost, "AdamW::update_ahead: kHost only");
  TORCH_CHECK(lr >= 0.0, "AdamW::update_ahead: lr must be >= 0, got ", lr);
  TORCH_CHECK(indices.size() == grads.size(), "AdamW::update_ahead: ", grads.size(),
              " gradients for ", indices.size(), " parameters");
  std::vector<Slot*> slots;
  std::vector<at::Tensor> sources;
  for (size_t k = 0; k < indices.size(); ++k) {
    TORCH_CHECK(indices[k] < slots_.size(), "AdamW::update_ahead: no parameter ", indices[k]);
    Slot& slot = slots_[indices[k]];
    if (!grads[k].defined() || slot.ahead) continue;
    check_grad(slot, grads[k]);
    slots.push_back(&slot);
    sources.push_back(grads[k]);
  }
  if (slots.empty()) return;
  at::NoGradGuard no_grad;
  // The uploads of the last pass still read the masters: wait before anything rewrites them.
  for (size_t k = 0; k < 2; ++k) wait_staging(k);
  for (c10::Event& copy : master_copies_) copy.synchronize();
  master_copies_.clear();
  for (Slot* slot : slots) {
    const auto keep = [](at::Tensor& kept, const at::Tensor& from) {
      if (!kept.defined()) kept = at::empty_like(from, at::MemoryFormat::Contiguous);
      kept.copy_(from);
    };
    keep(slot->kept_master, slot->master);
    keep(slot->kept_exp_avg, slot->exp_avg);
    keep(slot->kept_exp_avg_sq, slot->exp_avg_sq);
    if (slot->param.is_cpu() && !slot->master.is_same(slot->param)) {
      keep(slot->kept_param, slot->param);
    }
    slot->kept_step = slot->step;
    slot->ahead = true;
  }
  const UploadStats before = last_uploads_;
  time_phases_ = false;
  try {
    update_on_host(slots, sources, lr, 1.0);
  } catch (...) {
    time_phases_ = true;
    throw;
  }
  time_phases_ = true;
  last_uploads_ += before;  // update_streamed counts this pass's copies on top
}

void AdamW::restore_ahead() {
  at::NoGradGuard no_grad;
  for (size_t k = 0; k < 2; ++k) wait_staging(k);  // no upload reads what is put back
  for (c10::Event& copy : master_copies_) copy.synchronize();
  master_copies_.clear();
  for (Slot& slot : slots_) {
    if (!slot.ahead) continue;
    slot.master.copy_(slot.kept_master);
    slot.exp_avg.copy_(slot.kept_exp_avg);
    slot.exp_avg_sq.copy_(slot.kept_exp_avg_sq);
    slot.step = slot.kept_step;
    if (!slot.master.is_same(slot.param)) {
      if (slot.param.is_cpu()) {
        slot.param.copy_(slot.kept_param);
      } else {
        slot.param.copy_(slot.master);  // what the upload wrote before this step: its conversion
      }
    }
    slot.ahead = false;
  }
}

void AdamW::finish_ahead(double lr, const std::vector<at::Tensor>& grads, double grad_scale,
                         bool skip) {
  TORCH_CHECK(placement_ == OptimizerPlacement::kHost, "AdamW::finish_ahead: kHost only");
  TORCH_CHECK(grads.size() == slots_.size(), "AdamW::finish_ahead: ", grads.size(),
              " gradients for ", slots_.size(), " parameters");
  if (skip) {
    restore_ahead();
    return;
  }
  if (grad_scale != 1.0) {  // the norm clips: the update again, from the kept state
    restore_ahead();
    step(lr, grads, grad_scale);
    return;
  }
  std::vector<at::Tensor> rest(grads.size());  // the gradients of the parameters not yet updated
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (!slots_[i].ahead) rest[i] = grads[i];
  }
  const UploadStats ahead = last_uploads_;
  step(lr, rest, 1.0);
  last_uploads_ += ahead;
}

int64_t AdamW::updated_ahead() const {
  int64_t count = 0;
  for (const Slot& slot : slots_) count += slot.ahead ? 1 : 0;
  return count;
}

void AdamW::reload_parameters() {
  at::NoGradGuard no_grad;
  for (Slot& slot : slots_) {
    if (slot.master.defined() && slot.own_master) slot.master.copy_(slot.param);
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
    if (is_reduced(slot.param.scalar_type()) && slot.own_master && slot.master.defined()) {
      state.emplace_back(slot.name + kMaster, slot.master);
    }
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
    if (is_reduced(slot.param.scalar_type()) && slot.own_master && slot.master.defined() &&
        master_entry != unused.end()) {
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
    } else if (slots_[i].master.defined() && slots_[i].own_master) {
      slots_[i].master.copy_(slots_[i].param);
    }
  }
  step_count_ = step_count;
}

}  // namespace ulysses::train
