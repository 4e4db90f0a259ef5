// ZeRO-1/2: sharded AdamW over flat gradient buffers, reduce-scatter and all-gather by bucket
// (see zero_optimizer.h).
#include "zero/zero_optimizer.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>

#include "common/error.h"
#include "common/pinned_host.h"
#include "optim/cpu_adam.h"
#include "profile/phase_timer.h"
#include "zero/zero_partition.h"

namespace ulysses::train {
namespace {

std::string flat_name(size_t f) { return "zero.flat" + std::to_string(f); }
std::string param_name(size_t i) { return "zero.param" + std::to_string(i); }

}  // namespace

ZeroOptimizer::ZeroOptimizer(GradientBuffers& buffers, comm::Group& world,
                             const config::OptimOptions& options, OptimizerPlacement placement,
                             int64_t bucket_bytes, const ZeroStaging& staging)
    : buffers_(&buffers), world_(world), stage_(1), bucket_bytes_(bucket_bytes) {
  TORCH_CHECK(bucket_bytes >= 1, "ZeroOptimizer: bucket_bytes must be >= 1");
  NamedTensors named;
  for (size_t f = 0; f < buffers_->flats().size(); ++f) {
    const at::Tensor& flat = buffers_->flats()[f];  // [world * S_f]
    TORCH_CHECK(flat.numel() % world_.size() == 0,
                "ZeroOptimizer: gradient buffers must be padded to the world size");
    shard_numel_.push_back(flat.numel() / world_.size());
    if (placement == OptimizerPlacement::kHost) {  // page-locked: the step's copies are async
      masters_.push_back(zeros_on_host({shard_numel_.back()}, flat.scalar_type(), flat.is_cuda()));
    } else {
      masters_.push_back(at::zeros({shard_numel_.back()}, flat.options()));  // [S_f]
    }
    targets_.push_back(masters_.back());
    if (placement == OptimizerPlacement::kHost &&
        (!flat.is_cpu() || staging.stage_host_parameters)) {
      const at::ScalarType wire = gathered_dtype(f);
      const at::Tensor gathered =
          wire == flat.scalar_type() ? flat : flat.view(wire).narrow(0, 0, flat.numel());
      const int64_t shard = shard_numel_.back();
      targets_.back() = gathered.narrow(0, world_.rank() * shard, shard);  // [S_f]
    }
    named.emplace_back(flat_name(f), targets_.back());
  }
  copy_parameters_to_masters();
  make_adamw(std::move(named), options, placement, staging);
  find_host_shards(placement);
}

ZeroOptimizer::ZeroOptimizer(ZeroPartition& partition, const config::OptimOptions& options,
                             OptimizerPlacement placement, const ZeroStaging& staging)
    : partition_(&partition),
      world_(partition.world()),
      stage_(partition.stage()),
      bucket_bytes_(1) {
  NamedTensors named;
  for (size_t i = 0; i < partition.params().size(); ++i) {
    shard_numel_.push_back(partition.shard_numel(i));
    at::TensorOptions where = partition.grad_shards()[i].options();  // fp32 / fp64
    if (placement == OptimizerPlacement::kHost) where = where.device(at::kCPU);
    const at::Tensor values = partition.weight_values(i);  // [S_i]
    if (partition.stage() == 3 && values.options().dtype() == where.dtype() &&
        values.device() == where.device()) {
      masters_.push_back(values);  // fp32 weights are their own masters, as in stage 0
    } else if (placement == OptimizerPlacement::kHost) {  // page-locked: the copies are async
      masters_.push_back(zeros_on_host({shard_numel_.back()}, where.dtype().toScalarType(),
                                       partition.grad_shards()[i].is_cuda()));  // [S_i]
    } else {
      masters_.push_back(at::zeros({shard_numel_.back()}, where));  // [S_i]
    }
    targets_.push_back(masters_.back());
    if (placement == OptimizerPlacement::kHost &&
        (partition.stage() == 3 || !partition.grad_shards()[i].is_cpu() ||
         staging.stage_host_parameters)) {
      targets_.back() = partition.update_target(i);
    }
    named.emplace_back(entry_name(i), targets_.back());
  }
  copy_parameters_to_masters();
  make_adamw(std::move(named), options, placement, staging);
  find_host_shards(placement);
}

void ZeroOptimizer::make_adamw(NamedTensors named, const config::OptimOptions& options,
                               OptimizerPlacement placement, const ZeroStaging& staging) {
  if (placement == OptimizerPlacement::kHost) {
    adamw_ = std::make_unique<AdamW>(std::move(named), options, placement, masters_);
    if (staging.bytes > 0 || staging.stage_host_parameters) {
      adamw_->set_upload_staging_bytes(
          staging.bytes > 0 ? staging.bytes : adamw_->upload_staging_bytes(),
          staging.stage_host_parameters);
    }
  } else {
    adamw_ = std::make_unique<AdamW>(std::move(named), options, placement);
  }
}

void ZeroOptimizer::find_host_shards(OptimizerPlacement placement) {
  const std::vector<at::Tensor> grads = shard_grads();
  host_shards_ = placement == OptimizerPlacement::kHost &&
                 std::all_of(grads.begin(), grads.end(),
                             [](const at::Tensor& g) { return g.is_cpu() && g.is_contiguous(); });
  overlap_applies_ = host_shards_;
  for (size_t f = 0; f < targets_.size(); ++f) {
    // A target that is not the master lies in the gradients' memory (stages 1 and 2 under
    // staging), which the update writes over; stage 3's is the weight shard.
    const bool separate = !targets_[f].is_same(masters_[f]);
    if (separate && (partition_ == nullptr || stage_ == 2)) overlap_applies_ = false;
  }
}

at::ScalarType ZeroOptimizer::gathered_dtype(size_t f) const {
  const at::ScalarType accumulated = buffers_->flats()[f].scalar_type();
  std::optional<at::ScalarType> common;
  for (size_t i = 0; i < buffers_->params().size(); ++i) {
    if (buffers_->flat_index(i) != static_cast<int>(f)) continue;
    const at::ScalarType dtype = buffers_->params()[i].scalar_type();
    if (common && *common != dtype) return accumulated;
    common = dtype;
  }
  if (!common || c10::elementSize(*common) >= c10::elementSize(accumulated)) return accumulated;
  return *common;
}

std::string ZeroOptimizer::entry_name(size_t f) const {
  return partition_ != nullptr ? param_name(f) : flat_name(f);
}

std::vector<ZeroOptimizer::ShardSlice> ZeroOptimizer::shard_slices(size_t i) const {
  if (partition_ != nullptr) {  // parameter i is shard i, one piece per part (zero_partition.h)
    std::vector<ShardSlice> slices;
    for (const ZeroPartition::ShardPiece& piece : partition_->shard_pieces(i)) {
      slices.push_back({static_cast<int>(i), piece.shard_offset, piece.param_offset, piece.length});
    }
    return slices;
  }
  const int flat = buffers_->flat_index(i);
  if (flat < 0) return {};
  const int64_t begin = world_.rank() * shard_numel_[flat];
  const int64_t end = begin + shard_numel_[flat];
  const int64_t p_begin = buffers_->flat_offset(i);
  const int64_t p_end = p_begin + buffers_->params()[i].numel();
  const int64_t lo = std::max(begin, p_begin), hi = std::min(end, p_end);
  if (lo >= hi) return {};
  return {{flat, lo - begin, lo - p_begin, hi - lo}};
}

void ZeroOptimizer::copy_parameters_to_masters() {
  at::NoGradGuard no_grad;
  if (partition_ != nullptr) {
    for (size_t i = 0; i < masters_.size(); ++i) {
      const at::Tensor values = partition_->weight_values(i);
      if (!values.is_same(masters_[i])) masters_[i].copy_(values);
    }
    return;
  }
  const auto& params = buffers_->params();
  for (size_t i = 0; i < params.size(); ++i) {
    for (const ShardSlice& slice : shard_slices(i)) {
      masters_[slice.flat]
          .narrow(0, slice.shard_offset, slice.length)
          .copy_(params[i].detach().reshape({-1}).narrow(0, slice.param_offset, slice.length));
    }
  }
}

void ZeroOptimizer::reload_parameters() {
  if (partition_ != nullptr) partition_->reshard_from_params();
  copy_parameters_to_masters();
}

std::vector<at::Tensor> ZeroOptimizer::shard_grads() const {
  if (partition_ != nullptr) return partition_->grad_shards();
  std::vector<at::Tensor> out;
  for (size_t f = 0; f < masters_.size(); ++f) {
    out.push_back(buffers_->flats()[f].narrow(0, world_.rank() * shard_numel_[f], shard_numel_[f]));
  }
  return out;
}

void ZeroOptimizer::reduce_gradients(const GradientBuffers::SummedFn& on_summed) {
  if (world_.size() == 1 || partition_ != nullptr) return;  // the partition reduced per unit
  TORCH_CHECK(!on_summed || host_shards_,
              "ZeroOptimizer::reduce_gradients: on_summed needs host shards");
  profile::ScopedPhase phase("zero_reduce", profile::Category::kComm);
  // Stage 1: the buffers' all-reduce as at stage 0 (the layers' ranges may have started during
  // backward); only the own shard is read.
  buffers_->all_reduce(world_, bucket_bytes_, on_summed);
}

double ZeroOptimizer::norm_of_square_sums(const std::vector<std::vector<double>>& sums) {
  TORCH_CHECK(sums.size() == masters_.size(), "ZeroOptimizer: one chunk sum list per shard");
  double local = 0.0;
  for (const std::vector<double>& chunks : sums) {
    for (double chunk : chunks) local += chunk;  // shards in order, then chunks
  }
  at::Tensor sum_sq = at::tensor({local}, at::kDouble);  // [1]
  world_.all_reduce(sum_sq, comm::ReduceOp::kSum);     // [1] the world's sum of squares
  return std::sqrt(sum_sq.item<double>());
}

double ZeroOptimizer::clip(double max_norm) {
  profile::ScopedPhase phase("optimizer_norm", profile::Category::kOptimizer);
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> grads = shard_grads();
  double total_norm = 0.0;
  if (host_shards_) {  // the host update's chunked fp64 norm
    std::vector<std::vector<double>> sums;
    for (const at::Tensor& g : grads) {
      sums.push_back(host_gradient_square_sums(g, adamw_->options().host_threads));
    }
    total_norm = norm_of_square_sums(sums);
  } else {
    // Each shard's norm stays where the shard is; one stacked sum of squares and one copy to the
    // host per step (not one synchronising copy per shard).
    std::vector<at::Tensor> norms;  // each [] fp64
    for (const at::Tensor& g : grads) {
      const at::ScalarType accumulate = g.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
      norms.push_back(at::norm(g, 2, accumulate).to(grads.front().device(), at::kDouble));
    }
    at::Tensor sum_sq = norms.empty() ? at::zeros({1}, at::kDouble)
                                      : at::stack(norms).square().sum().reshape({1}).to(at::kCPU);
    world_.all_reduce(sum_sq, comm::ReduceOp::kSum);  // [1] the world's sum of squares
    total_norm = std::sqrt(sum_sq.item<double>());
  }
  if (max_norm <= 0.0 || !std::isfinite(total_norm)) return total_norm;
  const double coef = max_norm / (total_norm + 1e-6);
  if (coef < 1.0) {
    for (at::Tensor& g : grads) g.mul_(coef);
  }
  return total_norm;
}

void ZeroOptimizer::step(double lr) {
  // Device shards of host masters (optimizer offload) stay where they are: AdamW copies them to
  // page-locked host buffers without blocking, all before its host pass waits for them.
  const std::vector<at::Tensor> grads = shard_grads();
  // Stage 3 under kHost: AdamW writes the weight shards (no gather in flight may read them).
  if (partition_ != nullptr) partition_->begin_weight_update();
  {
    profile::ScopedPhase phase("optimizer");
    adamw_->step(lr, grads);
  }
  publish_step();
}

void ZeroOptimizer::publish_step() {
  uploads_ = adamw_->last_step_uploads();
  at::NoGradGuard no_grad;
  if (partition_ != nullptr) {  // stage 3: into the weight shards; stage 2: all-gathered
    partition_->set_weights(targets_, &uploads_);
    return;
  }
  // All-gather the updated shards into the (now dead) gradient buffers, bucket by bucket, then
  // copy each parameter's view into the parameter. When every parameter of a buffer has one
  // narrower dtype (bf16), the shards are converted first and gathered in it, in the first half of
  // the buffer's memory: half the bytes on the wire, the same values (one rounding either way).
  const auto& params = buffers_->params();
  std::vector<at::Tensor> gathered_flats;  // [world * S_f] each, in the gathered dtype
  {
    profile::ScopedPhase phase("zero_gather", profile::Category::kComm);
    const int world = world_.size();
    for (size_t f = 0; f < masters_.size(); ++f) {
      const at::Tensor& flat = buffers_->flats()[f];
      const at::ScalarType wire = gathered_dtype(f);
      at::Tensor target =
          wire == flat.scalar_type() ? flat : flat.view(wire).narrow(0, 0, flat.numel());
      const int64_t shard = shard_numel_[f];
      const int64_t bucket = std::max<int64_t>(bucket_bytes_ / target.element_size() / world, 1);
      for (int64_t o = 0; o < shard; o += bucket) {
        const int64_t n = std::min(bucket, shard - o);
        // The updated shard where AdamW left it: converted and on the flat's device already,
        // unless the masters are the targets (kDevice, or a CPU run).
        const at::Tensor mine = targets_[f].narrow(0, o, n);
        if (mine.device() != flat.device()) {
          uploads_.blocking += 1;
          uploads_.blocking_bytes += n * static_cast<int64_t>(c10::elementSize(wire));
        }
        at::Tensor gathered = world_.all_gather(mine.to(flat.device(), wire));
        target.view({world, shard}).narrow(1, o, n).copy_(gathered);  // [world, n]
      }
      gathered_flats.push_back(target);
    }
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (buffers_->flat_index(i) < 0) continue;
    const at::Tensor& target = gathered_flats[static_cast<size_t>(buffers_->flat_index(i))];
    params[i].detach().copy_(
        target.narrow(0, buffers_->flat_offset(i), params[i].numel()).view(params[i].sizes()));
  }
}

NamedTensors ZeroOptimizer::state_tensors() const {
  NamedTensors out = adamw_->state_tensors();
  for (size_t f = 0; f < masters_.size(); ++f) out.emplace_back(entry_name(f) + ".master", masters_[f]);
  return out;
}

void ZeroOptimizer::load_state(const NamedTensors& state, int64_t step_count,
                               const std::string& source) {
  NamedTensors adam;
  std::map<std::string, at::Tensor> masters;
  for (const auto& [name, t] : state) {
    const std::string suffix = ".master";
    if (name.size() > suffix.size() &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      masters[name] = t;
    } else {
      adam.emplace_back(name, t);
    }
  }
  for (size_t f = 0; f < masters_.size(); ++f) {
    const std::string name = entry_name(f) + ".master";
    auto it = masters.find(name);
    if (it == masters.end()) throw UserError(source + ": optimizer entry " + name + " is missing");
    if (!it->second.sizes().equals(masters_[f].sizes()) ||
        it->second.scalar_type() != masters_[f].scalar_type()) {
      throw UserError(source + ": optimizer entry " + name + " has shape " +
                      c10::str(it->second.sizes()) + ", expected " + c10::str(masters_[f].sizes()) +
                      " (written on another world size?)");
    }
  }
  if (masters.size() != masters_.size()) {
    throw UserError(source + ": unexpected ZeRO master entries (written on another layout)");
  }
  adamw_->load_state(adam, step_count, source);  // checks everything before copying
  for (size_t f = 0; f < masters_.size(); ++f) {
    masters_[f].copy_(masters.at(entry_name(f) + ".master"));
  }
}

void ZeroOptimizer::load_full_state(const NamedTensors& state,
                                    const std::vector<std::string>& names, int64_t step_count,
                                    const std::string& source) {
  const size_t count = partition_ != nullptr ? partition_->params().size() : buffers_->params().size();
  TORCH_CHECK(names.size() == count, "load_full_state: one name per parameter");
  std::map<std::string, at::Tensor> by_name(state.begin(), state.end());
  auto entry = [&](const std::string& key) -> const at::Tensor* {
    auto it = by_name.find(key);
    return it == by_name.end() ? nullptr : &it->second;
  };
  std::vector<at::Tensor> exp_avg, exp_avg_sq, masters;  // [S_f] each
  for (const at::Tensor& m : masters_) {
    exp_avg.push_back(at::zeros_like(m));
    exp_avg_sq.push_back(at::zeros_like(m));
    masters.push_back(m.clone());
  }
  copy_parameters_to_masters();  // defaults for parameters without a saved master
  for (size_t f = 0; f < masters_.size(); ++f) masters[f].copy_(masters_[f]);
  int64_t step = -1;
  for (size_t i = 0; i < count; ++i) {
    if (partition_ == nullptr && buffers_->flat_index(i) < 0) continue;  // not trained here
    const int64_t numel =
        partition_ != nullptr ? partition_->param_numel(i) : buffers_->params()[i].numel();
    for (const char* suffix : {".exp_avg", ".exp_avg_sq", ".step"}) {
      const at::Tensor* t = entry(names[i] + suffix);
      if (t == nullptr) throw UserError(source + ": optimizer entry " + names[i] + suffix + " is missing");
    }
    const at::Tensor& saved_step = *entry(names[i] + ".step");
    if (step < 0) step = saved_step.item<int64_t>();
    auto slice_into = [&](std::vector<at::Tensor>& dst, const std::string& key) {
      const at::Tensor& t = *entry(key);
      if (t.numel() != numel) {
        throw UserError(source + ": optimizer entry " + key + " has " + std::to_string(t.numel()) +
                        " elements, expected " + std::to_string(numel));
      }
      for (const ShardSlice& slice : shard_slices(i)) {
        dst[slice.flat]
            .narrow(0, slice.shard_offset, slice.length)
            .copy_(t.reshape({-1}).narrow(0, slice.param_offset, slice.length));
      }
    };
    slice_into(exp_avg, names[i] + ".exp_avg");
    slice_into(exp_avg_sq, names[i] + ".exp_avg_sq");
    if (entry(names[i] + ".master") != nullptr) slice_into(masters, names[i] + ".master");
  }
  NamedTensors adam;
  for (size_t f = 0; f < masters_.size(); ++f) {
    adam.emplace_back(entry_name(f) + ".exp_avg", exp_avg[f]);
    adam.emplace_back(entry_name(f) + ".exp_avg_sq", exp_avg_sq[f]);
    adam.emplace_back(entry_name(f) + ".step", at::tensor(std::max<int64_t>(step, 0), at::kLong));
  }
  adamw_->load_state(adam, step_count, source);
  for (size_t f = 0; f < masters_.size(); ++f) masters_[f].copy_(masters[f]);
}

}  // namespace ulysses::train
