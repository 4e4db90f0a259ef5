// ZeRO-2/3 parameter and gradient shards, per-unit gathers and reduce-scatters (see
// zero_partition.h).
#include "zero/zero_partition.h"

#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <regex>

#include <c10/util/accumulate.h>

#include "profile/phase_timer.h"

namespace ulysses::train {
namespace {

at::ScalarType accumulation_dtype(at::ScalarType param_dtype) {
  return param_dtype == at::kDouble ? at::kDouble : at::kFloat;
}

// Moves each gradient contribution autograd accumulated into .grad() into the owner's pending
// buffer and releases it, so no full-size gradient outlives its unit's backward.
struct MoveIntoPending : public torch::autograd::PostAccumulateGradHook {
  MoveIntoPending(ZeroPartition* owner, size_t index) : owner(owner), index(index) {}
  void operator()(const torch::autograd::Variable& param) override {
    at::Tensor& grad = param.mutable_grad();
    if (!grad.defined()) return;
    owner->accumulate(index, grad);
    grad.reset();
  }
  ZeroPartition* owner;
  size_t index;
};

struct EmbedCall : torch::CustomClassHolder {
  ZeroPartition* owner = nullptr;
  size_t index = 0;    // the embedding weight's parameter index
  int64_t vocab = 0;   // V
};

// The embedding as its own unit: the weight is an input only so that the output requires grad;
// backward returns no gradient for it (its AccumulateGrad never runs on the released weight) and
// adds the dense [V, h] gradient into the pending buffer itself.
struct ShardedEmbedding : public torch::autograd::Function<ShardedEmbedding> {
  // weight [V, h] (whole), ids [bs, T] -> [bs, T, h]
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& weight,
                            const at::Tensor& ids, c10::intrusive_ptr<EmbedCall> call) {
    at::Tensor out = at::embedding(weight, ids);
    ctx->save_for_backward({ids});
    ctx->saved_data["call"] = c10::IValue::make_capsule(std::move(call));
    return out;
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const c10::intrusive_ptr<torch::CustomClassHolder> holder = ctx->saved_data["call"].toCapsule();
    auto* call = static_cast<EmbedCall*>(holder.get());
    if (grads[0].defined()) {
      const at::Tensor ids = ctx->get_saved_variables().at(0);  // [bs, T]
      const at::Tensor grad = at::embedding_backward(grads[0], ids, call->vocab, -1, false, false);
      call->owner->accumulate(call->index, grad);  // [V, h]
    }
    return {at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

ZeroPartition::ZeroPartition(model::LlamaForCausalLM& model, comm::Group& world, int stage,
                             int64_t bucket_bytes)
    : model_(model), world_(world), stage_(stage), bucket_bytes_(bucket_bytes) {
  TORCH_CHECK(stage == 2 || stage == 3, "ZeroPartition: stage must be 2 or 3, got ", stage);
  TORCH_CHECK(bucket_bytes >= 1, "ZeroPartition: bucket_bytes must be >= 1");
  add_parameters(std::nullopt, std::nullopt);
  for (size_t i = 0; i < params_.size(); ++i) {
    weight_shards_.push_back(stage_ == 3 ? param_slice(i) : at::Tensor());
  }
}

ZeroPartition::ZeroPartition(model::LlamaForCausalLM& model, comm::Group& world,
                             int64_t bucket_bytes, const at::TensorOptions& weight_options,
                             const ShardFill& fill)
    : model_(model), world_(world), stage_(3), bucket_bytes_(bucket_bytes) {
  TORCH_CHECK(bucket_bytes >= 1, "ZeroPartition: bucket_bytes must be >= 1");
  const at::ScalarType weight_dtype = weight_options.dtype().toScalarType();
  add_parameters(weight_options.dtype(accumulation_dtype(weight_dtype)), weight_dtype);
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    weight_shards_.push_back(at::zeros({shard_numel_[i]}, weight_options));  // [S_i]
    // The placeholder goes: the parameter is released from the start, on the weights' device.
    params_[i].set_data(at::empty({0}, weight_options));
    whole_[i] = false;
  }
  fill_shards(fill);
}

void ZeroPartition::add_parameters(const std::optional<at::TensorOptions>& grad_options,
                                   std::optional<at::ScalarType> weight_dtype) {
  at::NoGradGuard no_grad;
  const int64_t w = world_.size();
  layer_units_.resize(static_cast<size_t>(model_->model->num_layers()));
  static const std::regex layer_name("model\\.layers\\.([0-9]+)\\..*");
  bool has_embedding = false;
  for (const auto& item : model_->named_parameters()) {
    const size_t i = params_.size();
    const at::Tensor& p = item.value();
    TORCH_CHECK(p.requires_grad() && p.is_leaf(), "ZeroPartition: ", item.key(),
                " must be a leaf that requires grad");
    params_.push_back(p);
    names_.push_back(item.key());
    shapes_.push_back(p.sizes().vec());
    // As few parts as fit a bucket per rank, of equal size: padding below one element per part.
    const int64_t whole_shard = std::max<int64_t>((p.numel() + w - 1) / w, 1);  // one part
    const int64_t element =
        static_cast<int64_t>(c10::elementSize(weight_dtype ? *weight_dtype : p.scalar_type()));
    const int64_t fits = std::max<int64_t>(bucket_bytes_ / element / w, 1);
    const int64_t parts = (whole_shard + fits - 1) / fits;
    part_numel_.push_back((whole_shard + parts - 1) / parts);
    shard_numel_.push_back(parts * part_numel_.back());
    whole_.push_back(true);
    const at::TensorOptions grad_where =
        grad_options ? *grad_options : p.options().dtype(accumulation_dtype(p.scalar_type()));
    grad_shards_.push_back(at::zeros({shard_numel_.back()}, grad_where));
    pending_.emplace_back();
    std::smatch match;
    if (std::regex_match(item.key(), match, layer_name)) {
      layer_units_.at(std::stoul(match[1])).push_back(i);
    } else if (item.key() == "model.embed_tokens.weight") {
      embedding_unit_.push_back(i);
      embedding_index_ = i;
      has_embedding = true;
    } else {  // model.norm.weight, lm_head.weight
      head_unit_.push_back(i);
    }
  }
  TORCH_CHECK(has_embedding, "ZeroPartition: the model has no model.embed_tokens.weight");
  if (model_->options().tie_embeddings) head_unit_.push_back(embedding_index_);
  for (size_t i = 0; i < params_.size(); ++i) {
    torch::autograd::impl::set_post_acc_grad_hooks(params_[i],
                                                   std::make_unique<MoveIntoPending>(this, i));
  }
}

void ZeroPartition::fill_shards(const ShardFill& fill) {
  TORCH_CHECK(stage_ == 3, "ZeroPartition::fill_shards: stage 3 only");
  at::NoGradGuard no_grad;
  settle_prefetch();
  for (size_t i = 0; i < params_.size(); ++i) {
    TORCH_CHECK(!whole_[i], "ZeroPartition::fill_shards: ", names_[i], " is gathered");
    for (const ShardPiece& piece : shard_pieces(i)) {
      fill(i, names_[i], shapes_[i], piece.param_offset,
           weight_shards_[i].narrow(0, piece.shard_offset, piece.length));
    }
  }
}

at::ScalarType ZeroPartition::weight_dtype(size_t i) const {
  return weight_shards_[i].defined() ? weight_shards_[i].scalar_type() : params_[i].scalar_type();
}

std::vector<ZeroPartition::ShardPiece> ZeroPartition::shard_pieces(int64_t numel,
                                                                    int64_t shard_numel,
                                                                    int64_t part_numel,
                                                                    int64_t world, int64_t rank) {
  std::vector<ShardPiece> pieces;
  for (int64_t k = 0; k * part_numel < shard_numel; ++k) {
    const int64_t begin = (k * world + rank) * part_numel;
    const int64_t length = std::min(part_numel, numel - begin);
    if (length > 0) pieces.push_back({k * part_numel, begin, length});
  }
  return pieces;
}

std::vector<ZeroPartition::ShardPiece> ZeroPartition::shard_pieces(size_t i) const {
  return shard_pieces(param_numel(i), shard_numel_[i], part_numel_[i], world_.size(),
                      world_.rank());
}

at::Tensor ZeroPartition::gather_part(size_t i, int64_t k) {
  TORCH_CHECK(stage_ == 3, "ZeroPartition::gather_part: stage 3 only");
  at::NoGradGuard no_grad;
  profile::ScopedPhase phase("zero_gather", profile::Category::kComm);
  const int64_t p = part_numel_[i];
  return world_.all_gather(weight_shards_[i].narrow(0, k * p, p)).view({-1});  // [world * P_i]
}

ZeroPartition::~ZeroPartition() {
  for (auto& p : params_) torch::autograd::impl::set_post_acc_grad_hooks(p, nullptr);
}

const std::vector<size_t>& ZeroPartition::unit_params(int64_t unit) const {
  if (unit == kEmbedding) return embedding_unit_;
  if (unit == kHead) return head_unit_;
  return layer_units_.at(static_cast<size_t>(unit));
}

int64_t ZeroPartition::param_numel(size_t i) const { return c10::multiply_integers(shapes_[i]); }

bool ZeroPartition::all_released() const {
  return std::none_of(whole_.begin(), whole_.end(), [](bool whole) { return whole; });
}

void ZeroPartition::zero_grads() {
  finish_reductions();  // none in a step that ended normally
  for (auto& g : grad_shards_) g.zero_();
  for (auto& p : pending_) p.reset();
}

at::Tensor ZeroPartition::weight_values(size_t i) const {
  return stage_ == 3 ? weight_shards_[i] : param_slice(i);
}

at::Tensor ZeroPartition::param_slice(size_t i) const {
  TORCH_CHECK(whole_[i], "ZeroPartition: ", names_[i], " is not whole");
  const at::Tensor flat = params_[i].detach().reshape({-1});  // [n_i]
  at::Tensor out = at::zeros({shard_numel_[i]}, flat.options());  // [S_i]
  for (const ShardPiece& piece : shard_pieces(i)) {
    out.narrow(0, piece.shard_offset, piece.length)
        .copy_(flat.narrow(0, piece.param_offset, piece.length));
  }
  return out;
}

void ZeroPartition::reshard_from_params() {
  if (stage_ != 3) return;
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (whole_[i]) weight_shards_[i].copy_(param_slice(i));  // in place: the optimizer may alias it
  }
}

ZeroPartition::UnitGather ZeroPartition::start_gather(int64_t unit) {
  UnitGather g;
  g.unit = unit;
  const int64_t w = world_.size();
  for (size_t i : unit_params(unit)) {
    if (whole_[i]) continue;
    g.members.push_back(i);
    const at::Tensor& shard = weight_shards_[i];  // [S_i]
    const int64_t p = part_numel_[i];
    g.fulls.push_back(at::empty({w * shard_numel_[i]}, shard.options()));  // [world * S_i]
    for (int64_t k = 0; k * p < shard_numel_[i]; ++k) {  // part k: [w, P_i] in its place
      const at::Tensor place = g.fulls.back().narrow(0, k * w * p, w * p).view({w, p});
      g.parts.push_back(world_.all_gather_start(shard.narrow(0, k * p, p), place));
    }
  }
  return g;
}

void ZeroPartition::finish_gather(UnitGather& g) {
  for (auto& part : g.parts) part.wait();  // in place
  for (size_t m = 0; m < g.members.size(); ++m) {
    const size_t i = g.members[m];
    if (whole_[i]) continue;  // made whole meanwhile (a tied weight gathered for another unit)
    params_[i].set_data(g.fulls[m].narrow(0, 0, param_numel(i)).view(shapes_[i]));
    whole_[i] = true;
  }
}

int64_t ZeroPartition::next_unit(int64_t unit, int64_t previous) const {
  const int64_t layers = static_cast<int64_t>(layer_units_.size());
  if (layers == 0) return kNoUnit;
  if (unit == kEmbedding) return 0;
  if (unit == kHead) return layers - 1;  // backward runs the layers next
  const bool forward = previous == unit - 1 || (unit == 0 && previous == kEmbedding);
  const bool backward = previous == unit + 1 || (unit == layers - 1 && previous == kHead);
  if (forward) return unit + 1 < layers ? unit + 1 : kHead;
  if (backward) return unit > 0 ? unit - 1 : kNoUnit;
  return kNoUnit;
}

void ZeroPartition::settle_prefetch() {
  if (!in_flight_) return;
  UnitGather g = std::move(*in_flight_);
  in_flight_.reset();
  finish_gather(g);
  release_unit(g.unit);
}

void ZeroPartition::gather_unit(int64_t unit) {
  if (stage_ != 3) return;
  // No prefetch after the head without autograd (evaluation: the next unit is the next batch's
  // embedding, which embed() asks for first).
  const bool no_backward = unit == kHead && !at::GradMode::is_enabled();
  at::NoGradGuard no_grad;
  profile::ScopedPhase phase("zero_gather", profile::Category::kComm);
  if (in_flight_ && in_flight_->unit == unit) {
    UnitGather g = std::move(*in_flight_);
    in_flight_.reset();
    finish_gather(g);
    ++prefetch_hits_;
  } else {
    settle_prefetch();  // a prefetch of another unit: not what runs next after all
  }
  const std::vector<size_t>& members = unit_params(unit);
  if (!std::all_of(members.begin(), members.end(), [&](size_t i) { return whole_[i]; })) {
    UnitGather g = start_gather(unit);
    finish_gather(g);
  }
  const int64_t next = pinned_ || no_backward ? kNoUnit : next_unit(unit, last_gathered_);
  last_gathered_ = unit;
  if (next != kNoUnit) {
    UnitGather g = start_gather(next);
    if (!g.members.empty()) in_flight_ = std::move(g);
  }
  // What is gathered now: the whole parameters and the prefetch's buffers.
  int64_t bytes = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (whole_[i]) bytes += params_[i].numel() * static_cast<int64_t>(params_[i].element_size());
  }
  if (in_flight_) {
    for (const at::Tensor& full : in_flight_->fulls) {
      bytes += full.numel() * static_cast<int64_t>(full.element_size());
    }
  }
  peak_whole_bytes_ = std::max(peak_whole_bytes_, bytes);
}

void ZeroPartition::release_unit(int64_t unit) {
  if (stage_ != 3 || pinned_) return;
  for (size_t i : unit_params(unit)) {
    if (!whole_[i]) continue;
    params_[i].set_data(at::empty({0}, weight_shards_[i].options()));  // storage of 0 bytes
    whole_[i] = false;
  }
}

void ZeroPartition::accumulate(size_t i, const at::Tensor& grad) {
  at::NoGradGuard no_grad;
  if (!pending_[i].defined()) {
    pending_[i] = at::zeros({world_.size() * shard_numel_[i]}, grad_shards_[i].options());
  }
  pending_[i].narrow(0, 0, grad.numel()).view(grad.sizes()).add_(grad);  // fp32 += any dtype
}

void ZeroPartition::reduce_unit(int64_t unit) {
  at::NoGradGuard no_grad;
  if (!reductions_.empty()) ++overlapped_reductions_;
  finish_reductions();
  profile::ScopedPhase phase("zero_reduce", profile::Category::kComm);
  const int64_t w = world_.size();
  // Every member is reduced, a zero pending buffer for one without a gradient, so that the ranks'
  // collectives pair up whatever each rank's autograd produced. A reduction in flight holds its
  // input (the pending buffer, or the copy of a part of it) until it is waited for.
  for (size_t i : unit_params(unit)) {
    const int64_t s = shard_numel_[i], p = part_numel_[i];
    if (!pending_[i].defined()) pending_[i] = at::zeros({w * s}, grad_shards_[i].options());
    for (int64_t k = 0; k * p < s; ++k) {  // part k: [w, P_i], contiguous in the pending buffer
      const at::Tensor part = pending_[i].narrow(0, k * w * p, w * p).view({w, p});
      reductions_.push_back({i, k * p, p, world_.reduce_scatter_start(part)});
    }
    pending_[i].reset();
  }
}

void ZeroPartition::finish_reductions() {
  if (reductions_.empty()) return;
  at::NoGradGuard no_grad;
  profile::ScopedPhase phase("zero_reduce", profile::Category::kComm);
  std::vector<size_t> reduced;
  for (Reduction& r : reductions_) {
    grad_shards_[r.i].narrow(0, r.o, r.n).add_(r.work.wait());
    if (reduced.empty() || reduced.back() != r.i) reduced.push_back(r.i);  // parts in a row
  }
  reductions_.clear();
  if (on_reduced_) on_reduced_(reduced);
}

int64_t ZeroPartition::reductions_per_micro_batch(size_t i) const {
  int64_t units = 0;
  for (const auto& unit : layer_units_) units += std::count(unit.begin(), unit.end(), i);
  units += std::count(embedding_unit_.begin(), embedding_unit_.end(), i);
  units += std::count(head_unit_.begin(), head_unit_.end(), i);
  return units;
}

void ZeroPartition::reduce_pending() {
  reduce_unit(kEmbedding);
  finish_reductions();
  for (size_t i = 0; i < pending_.size(); ++i) {
    TORCH_CHECK(!pending_[i].defined(), "ZeroPartition: ", names_[i],
                " has a gradient outside its unit's backward");
  }
}

void ZeroPartition::gather_all() {
  gather_unit(kEmbedding);
  for (size_t l = 0; l < layer_units_.size(); ++l) gather_unit(static_cast<int64_t>(l));
  gather_unit(kHead);
  pinned_ = true;
}

void ZeroPartition::walk_units() {
  if (stage_ != 3) return;
  gather_unit(kEmbedding);
  release_unit(kEmbedding);
  for (size_t l = 0; l < layer_units_.size(); ++l) {
    gather_unit(static_cast<int64_t>(l));
    release_unit(static_cast<int64_t>(l));
  }
  gather_unit(kHead);
  release_unit(kHead);
}

void ZeroPartition::release_all() {
  pinned_ = false;
  settle_prefetch();
  release_unit(kEmbedding);
  for (size_t l = 0; l < layer_units_.size(); ++l) release_unit(static_cast<int64_t>(l));
  release_unit(kHead);
}

at::Tensor ZeroPartition::embed(const at::Tensor& input_ids) {
  gather_unit(kEmbedding);
  auto call = c10::make_intrusive<EmbedCall>();
  call->owner = this;
  call->index = embedding_index_;
  call->vocab = shapes_[embedding_index_].at(0);
  at::Tensor out = ShardedEmbedding::apply(params_[embedding_index_], input_ids, std::move(call));
  release_unit(kEmbedding);
  return out;  // [bs, T, h]
}

void ZeroPartition::begin_weight_update() {
  if (stage_ != 3) return;
  settle_prefetch();  // a gather in flight reads the shards about to change
  for (size_t i = 0; i < params_.size(); ++i) {
    TORCH_CHECK(!whole_[i], "ZeroPartition: ", names_[i],
                " is gathered while its shard is updated");
  }
}

at::Tensor ZeroPartition::update_target(size_t i) const {
  if (stage_ == 3) return weight_shards_[i];
  const at::ScalarType dtype = params_[i].scalar_type();
  TORCH_CHECK(c10::elementSize(dtype) <= static_cast<size_t>(grad_shards_[i].element_size()),
              "ZeroPartition::update_target: weights wider than their gradients");
  const at::Tensor& grad = grad_shards_[i];  // [S_i]
  return (dtype == grad.scalar_type() ? grad : grad.view(dtype)).narrow(0, 0, shard_numel_[i]);
}

void ZeroPartition::set_weights(const std::vector<at::Tensor>& masters, UploadStats* uploads) {
  TORCH_CHECK(masters.size() == params_.size(), "ZeroPartition::set_weights: one master per parameter");
  at::NoGradGuard no_grad;
  begin_weight_update();
  const auto count = [&](const at::Tensor& from, const at::Tensor& to, int64_t n) {
    if (uploads == nullptr || from.device() == to.device()) return;
    uploads->blocking += 1;
    uploads->blocking_bytes += n * static_cast<int64_t>(to.element_size());
  };
  if (stage_ == 3) {
    for (size_t i = 0; i < params_.size(); ++i) {
      if (weight_shards_[i].is_same(masters[i])) continue;
      count(masters[i], weight_shards_[i], shard_numel_[i]);
      weight_shards_[i].copy_(masters[i]);
    }
    return;
  }
  profile::ScopedPhase phase("zero_gather", profile::Category::kComm);
  const int64_t w = world_.size();
  for (size_t i = 0; i < params_.size(); ++i) {
    const int64_t s = shard_numel_[i], p = part_numel_[i];
    at::Tensor full = at::empty({w * s}, params_[i].options());  // [world * S_i]
    for (int64_t k = 0; k * p < s; ++k) {
      count(masters[i], full, p);
      // [P_i]: no copy when the master is the update target (update_target)
      const at::Tensor mine = masters[i].narrow(0, k * p, p).to(full.scalar_type());
      world_.all_gather_start(mine, full.narrow(0, k * w * p, w * p).view({w, p})).wait();
    }
    params_[i].detach().copy_(full.narrow(0, 0, params_[i].numel()).view(shapes_[i]));
  }
}

int64_t ZeroPartition::weight_bytes() const {
  int64_t total = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    total += params_[i].storage().nbytes();
    if (weight_shards_[i].defined()) total += weight_shards_[i].storage().nbytes();
  }
  return total;
}

int64_t ZeroPartition::grad_bytes() const {
  int64_t total = 0;
  for (const auto& g : grad_shards_) total += g.storage().nbytes();
  for (const auto& p : pending_) total += p.defined() ? p.storage().nbytes() : 0;
  return total;
}

}  // namespace ulysses::train
