// ZeRO (zero.stage) over the world group: each rank keeps AdamW state and fp32 master weights for
// 1/world of the model only. Stage 1 shards the flat gradient buffers and all-gathers the updated
// shards back into the (full) parameters after each step; stages 2 and 3 shard every parameter
// (zero_partition.h): shard-sized gradients reduced per unit during backward, and in stage 3 the
// updated shards stay shards (the weights are gathered per unit when used).
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/group.h"
#include "config/options.h"
#include "optim/adamw.h"
#include "zero/grad_buffers.h"
#include "zero/zero_partition.h"

namespace ulysses::train {

// Optimizer offload (kHost): AdamW's two staging buffers (AdamW::set_upload_staging_bytes).
struct ZeroStaging {
  int64_t bytes = 0;                   // of each buffer; 0: AdamW's default
  bool stage_host_parameters = false;  // a CPU run takes the device path (tests; targets_)
};

// The optimizer of a ZeRO run. Flat layout (the first constructor; the trainer's stage 1): each flat buffer f of `buffers` ([world * S_f],
// padded by GradientBuffers(params, world)) is split into `world` contiguous shards of S_f
// elements; this rank owns shard rank(), elements [rank * S_f, (rank + 1) * S_f). For every f it
// holds one flat master tensor ([S_f], the flat's dtype: fp32, fp64 for fp64 parameters) and an
// AdamW over those masters ("zero.flat<f>"): AdamW is elementwise and optim.weight_decay is one
// value for all parameters, so updating a flat shard is the same arithmetic as updating the
// parameters one by one (padding stays 0: zero gradient, zero moments, zero weight).
// With kHost (memory.offload_optimizer) the masters and moments live in host memory (ZeRO-Offload),
// and the updated weights go back to the device converted, through AdamW's page-locked staging
// buffers, piece by piece without blocking while the host updates the next piece (targets_).
// Parameter layout (the second constructor; stages 2 and 3): shard i is parameter i's [S_i]
// (zero_partition.h), AdamW entries "zero.param<i>"; the partition already reduce-scattered the
// gradients during backward, so reduce_gradients() does nothing, and step() hands the updated
// masters to ZeroPartition::set_weights.
//
// One step: reduce_gradients() (flat layout, stage 1: all-reduce of every bucket as stage 0 does,
// then this rank reads its shard), clip() (global norm from every rank's shard), step() (AdamW on the shard,
// then all-gather of the updated shards bucket by bucket into the gradient buffer, which is dead
// until the next zero(), and from there into the parameters in their dtype: no extra full-model
// copy). Phases: zero_reduce and zero_gather (category comm).
// Collective: every rank of `world` calls every method in the same order.
// Not thread-safe; holds references to `buffers` and `world` (they must outlive it).
class ZeroOptimizer {
 public:
  // Stage 1. REQUIRES: buffers built with shards == world.size() over the parameters being
  // trained. Throws UserError as AdamW does for bad optim options. Copies the parameters' values
  // of this rank's shard into the masters.
  ZeroOptimizer(GradientBuffers& buffers, comm::Group& world, const config::OptimOptions& options,
                OptimizerPlacement placement, int64_t bucket_bytes,
                const ZeroStaging& staging = {});
  // Parameter layout over `partition` (stage 2 or 3; it must outlive this). Masters from
  // partition.weight_values().
  ZeroOptimizer(ZeroPartition& partition, const config::OptimOptions& options,
                OptimizerPlacement placement, const ZeroStaging& staging = {});

  int stage() const { return stage_; }
  // "flat" (first constructor) or "param" (second): how the shards cut the model.
  const char* layout() const { return partition_ != nullptr ? "param" : "flat"; }
  ZeroPartition* partition() const { return partition_; }
  const comm::Group& world() const { return world_; }

  // Reduces the unreduced per-rank sums in the buffers (compute_gradients with reduce = false)
  // over the world; afterwards shard_grads() hold the global sums of this rank's shard.
  // on_summed (flat layout, host_shards() only; may be empty): GradientBuffers::all_reduce's, told
  // as each flat's summed prefix grows (this rank's shard f is final once it reaches
  // (rank + 1) * S_f). Nothing is called in the parameter layout, whose shards were reduced
  // during backward.
  void reduce_gradients(const GradientBuffers::SummedFn& on_summed = {});

  // Global L2 norm over all shards (sum of squares of each shard, all-reduced), then, when
  // max_norm > 0, the norm is finite and max_norm / (norm + 1e-6) < 1, scales this rank's shards
  // by that coefficient: clip_gradients' semantics (grad_clip.h). The same value on every rank.
  // host_shards(): each shard's sum of squares is its 64K-element chunks' fp64 sums
  // (host_gradient_square_sums), as the host update's own norm takes it (norm_of_square_sums).
  double clip(double max_norm);

  // AdamW at lr on this rank's shards, then all-gathers every shard into the parameters.
  void step(double lr);

  // The optimizer offloaded (kHost) with every gradient shard in host memory (a CPU run), so
  // that a host thread can read them: where the overlapped update applies
  // (overlapped_shard_update.h) and clip() takes the chunked host norm.
  bool host_shards() const { return host_shards_; }
  // host_shards() and AdamW writing the masters themselves (not a staging target that shares the
  // gradients' memory): an update made ahead can be undone and made again.
  bool overlap_applies() const { return overlap_applies_; }
  // The AdamW over this rank's shards: entry f updates shard f (shard_grads()[f]).
  AdamW& shard_optimizer() { return *adamw_; }
  // Collective: the global norm from this rank's shards' chunk sums of squares (sums[f]:
  // host_gradient_square_sums of shard_grads()[f]), added shard by shard and chunk by chunk in
  // fp64 and all-reduced over the world; what clip() computes under host_shards().
  double norm_of_square_sums(const std::vector<std::vector<double>>& sums);
  // Collective, the second half of step() once the shard optimizer has updated the shards: the
  // updated shards into the parameters (stage 1: all-gathered; 2: set_weights' all-gather; 3:
  // the weight shards), and last_step_uploads() from the shard optimizer's.
  void publish_step();

  // The last step()'s copies of updated weights from the host masters to the weights' device
  // (kHost; zeros for kDevice): AdamW's (through its staging buffers or from the masters) plus any
  // blocking copy outside it (none where the gradients are on a device or stage_host_parameters
  // is set: see targets_).
  const UploadStats& last_step_uploads() const { return uploads_; }

  // This rank's gradient shards ([S_f] views of the buffers), valid after reduce_gradients().
  std::vector<at::Tensor> shard_grads() const;

  // Number of step() calls (after load_state: loaded count plus later calls).
  int64_t step_count() const { return adamw_->step_count(); }

  // This rank's optimizer state for a checkpoint: AdamW's entries for "zero.flat<f>" plus
  // "zero.flat<f>.master" ([S_f], the master shard); "zero.param<i>..." in the parameter layout.
  // Aliases live state.
  NamedTensors state_tensors() const;

  // Restores a state written by state_tensors() on the same world size and layout (bit-exact).
  // Throws UserError "<source>: ..." when an entry is missing, unexpected or mis-shaped.
  void load_state(const NamedTensors& state, int64_t step_count, const std::string& source);

  // Loads an unsharded AdamW state (AdamW::state_tensors()' per-parameter entries, e.g. from a
  // zero.stage 0 checkpoint or rebuilt from another world's shards): this rank's slices of each
  // parameter's moments; masters from "<param>.master" entries where present, else from the
  // parameters (load the weights first). names[i] is buffers.params()[i]'s name.
  // Throws UserError "<source>: ..." naming a missing or mis-shaped entry.
  void load_full_state(const NamedTensors& state, const std::vector<std::string>& names,
                       int64_t step_count, const std::string& source);

  // Copies this rank's shard of the parameters into the masters (after loading weights without
  // load_state); in stage 3 recomputes the weight shards from the whole parameters first.
  void reload_parameters();

 private:
  // Where parameter i meets this rank's shard of its flat: `length` elements, at `shard_offset`
  // in the shard ([S_f]) and at `param_offset` in the flattened parameter. None when they do not
  // meet or the parameter has no flat; one per part in the parameter layout (ZeroPartition).
  struct ShardSlice {
    int flat = -1;
    int64_t shard_offset = 0, param_offset = 0, length = 0;
  };
  std::vector<ShardSlice> shard_slices(size_t i) const;
  std::string entry_name(size_t f) const;  // "zero.flat<f>" or "zero.param<f>"
  // ZeRO-1: the dtype buffer f is all-gathered in: its parameters' common dtype when narrower
  // than the accumulation dtype, else the accumulation dtype.
  at::ScalarType gathered_dtype(size_t f) const;

  // Copies the parameters' values that fall in this rank's shard of each flat into masters_.
  void copy_parameters_to_masters();
  // Builds adamw_ over `named` (targets_), with masters_ as its masters under kHost.
  void make_adamw(NamedTensors named, const config::OptimOptions& options,
                  OptimizerPlacement placement, const ZeroStaging& staging);

  GradientBuffers* buffers_ = nullptr;  // flat layout
  ZeroPartition* partition_ = nullptr;  // parameter layout
  comm::Group& world_;
  int stage_;
  int64_t bucket_bytes_;
  std::vector<int64_t> shard_numel_;   // S_f per flat (S_i per parameter)
  std::vector<at::Tensor> masters_;    // [S_f] per flat, master weights of this rank's shard
  // [S_f] per flat: the parameters AdamW updates, where the gathers read the updated shard.
  // kDevice, and kHost with host gradients (a CPU run): masters_ themselves (AdamW's pass reads
  // the gradients where they lie, so nothing may share their memory). Otherwise (kHost with
  // device gradients, or stage_host_parameters) AdamW copies each piece of the gradients to the
  // host before it writes that piece's weights, converted, through its page-locked staging
  // buffers, without blocking, into memory on the gradients' device: stage 1 this rank's slice
  // of the flat's first bytes viewed in the gathered dtype (where the all-gather puts it
  // anyway); stage 2 the gradient shard's memory viewed in the weights' dtype
  // (ZeroPartition::update_target); stage 3 (any kHost) the weight shards. At stages 1 and 2
  // that memory can still hold gradients not read yet (rank 0's stage-1 slice overlaps the first
  // half of its own shard): the bf16 weights of piece [a, e) land in the fp32 gradient bytes of
  // [a/2, e/2), whose download finished before the piece's update, and never in [e, ...), which
  // later pieces still download. That order (each piece's download before its upload) is what
  // keeps it safe.
  std::vector<at::Tensor> targets_;
  std::unique_ptr<AdamW> adamw_;       // over ("zero.flat<f>", targets_[f]) with masters_
  bool host_shards_ = false;           // see host_shards()
  bool overlap_applies_ = false;       // see overlap_applies()
  // Sets host_shards_ and overlap_applies_ (after targets_ are made).
  void find_host_shards(OptimizerPlacement placement);
  UploadStats uploads_;
};

}  // namespace ulysses::train
