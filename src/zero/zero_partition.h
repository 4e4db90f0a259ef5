// ZeRO stages 2 and 3 (zero.stage): per-parameter shards of the fp32 gradients (both) and of the
// weights (3), the gathers and reduce-scatters around each unit of the model, and the units'
// forward/backward order (gradient_step.cpp drives it; decoder layers go through the layer runner).
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <climits>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/group.h"
#include "memory/activation_checkpoint.h"
#include "model/llama.h"
#include "optim/adamw.h"

namespace ulysses::train {

// Layout: parameter i (numel n_i) is flattened and cut into parts of world * P_i elements (the
// last padded with zeros), and rank r owns the r-th P_i elements of every part: shard element j
// is element (j / P_i) * world * P_i + r * P_i + j % P_i of the parameter. P_i = ceil(n_i / world)
// when that much of the weights' dtype fits a bucket (bucket_bytes / world): one part, rank r owns
// elements [r * S_i, (r+1) * S_i), as DeepSpeed's stage 3 partitions; else P_i is what fits and
// S_i = (number of parts) * P_i, the fewest parts of equal size that fit. Either way a part is
// gathered and reduce-scattered in place: its world * P_i elements are contiguous in the whole
// parameter, so parameters of any size need no buffer of their own and no copy (with Gloo, bf16
// weights go over the wire in fp32 and are copied in). P_i is counted in the weights' dtype, so
// with bf16 weights a part of the fp32 gradients is twice zero.bucket_mb.
//  - gradients: grad_shards()[i] [S_i], fp32 (fp64 for fp64 parameters), this rank's shard of the
//    global sum over the world. No full-size gradient buffer exists: every gradient contribution
//    autograd produces is moved (post-accumulate-grad hook) into a per-parameter fp32 pending
//    buffer [world * S_i] that lives only until its unit is reduce-scattered into the shard
//    (part by part).
//  - weights (stage 3): weight_shard(i) [S_i] in the parameter's dtype; between uses the
//    parameter's data is an empty tensor ([0], storage of 0 bytes). A unit is gathered (one
//    all-gather per part, each into its place in a [world * S_i] tensor the parameter then views)
//    before each use and released after it. Stage 2 keeps the full weights and gathers nothing.
// Units: decoder layer l (0..L-1), the embedding (L), the head = final norm + LM head weight
// (L + 1; with tied embeddings the embedding weight, gathered again for this use).
// Order of one micro-batch (gradient_step.cpp): embed() (gather, forward, release; its gradient is
// added by embed()'s backward), layers through the layer runner (gather, forward, release;
// backward: gather, recompute, nested backward, reduce_unit, release), then the head: gather_unit,
// norm + loss forward and backward, reduce_unit, release_unit; backward through the layers; last
// reduce_pending() for the embedding's gradient.
// Phases zero_gather and zero_reduce (category comm) time the collectives.
// Collective: every rank of `world` calls every method in the same order. Not thread-safe beyond
// autograd's own calls of the hooks; holds references to `model` and `world`.
// Invariants: a parameter is whole between gather_unit and release_unit (or gather_all and
// release_all); gradient contributions arrive only while its unit is whole (embed() excepted: its
// backward writes into the pending buffer itself).
class ZeroPartition : public memory::LayerParameterHooks {
 public:
  enum : int64_t { kEmbedding = -1, kHead = -2 };  // unit ids beside the layer indices

  // Writes elements [begin, begin + out.numel()) of parameter `index`'s flattened value (named
  // `name`, of `shape`) into `out` ([n], the weights' device and dtype): the initial values
  // (model::init_weight_range) or a checkpoint's (model::HfWeightIndex::read).
  using ShardFill = std::function<void(size_t index, const std::string& name,
                                       at::IntArrayRef shape, int64_t begin, at::Tensor out)>;

  // REQUIRES: stage 2 or 3; parameters on one device; bucket_bytes >= 1. Computes the shards
  // from the current (whole) parameters and installs the gradient hooks; the weights stay whole
  // until release_all() (load checkpoints first).
  ZeroPartition(model::LlamaForCausalLM& model, comm::Group& world, int stage, int64_t bucket_bytes);
  // Stage 3 without the whole model (the sharded build): `model` built with
  // WeightInit::kShapesOnly. Each rank allocates only its weight shards ([S_i], `weight_options`:
  // the training device and dtype; zero padding) and `fill` writes their elements; the
  // parameters start released. Nothing of the size of a whole parameter is allocated, so the
  // values equal the whole model's init whatever the world (fill draws by range).
  // REQUIRES: bucket_bytes >= 1.
  ZeroPartition(model::LlamaForCausalLM& model, comm::Group& world, int64_t bucket_bytes,
                const at::TensorOptions& weight_options, const ShardFill& fill);
  ~ZeroPartition() override;
  ZeroPartition(const ZeroPartition&) = delete;
  ZeroPartition& operator=(const ZeroPartition&) = delete;

  int stage() const { return stage_; }
  comm::Group& world() const { return world_; }
  const std::vector<at::Tensor>& params() const { return params_; }  // model->parameters()
  const std::vector<std::string>& names() const { return names_; }
  int64_t shard_numel(size_t i) const { return shard_numel_[i]; }
  const std::vector<int64_t>& part_numels() const { return part_numel_; }  // P_i

  // Where rank `rank`'s shard of a parameter of `numel` elements lies in the flattened parameter
  // (layout above: shard_numel S, part_numel P; P == S is one part): one piece per part, without
  // the padding (none past numel).
  struct ShardPiece {
    int64_t shard_offset, param_offset, length;
  };
  static std::vector<ShardPiece> shard_pieces(int64_t numel, int64_t shard_numel,
                                              int64_t part_numel, int64_t world, int64_t rank);
  std::vector<ShardPiece> shard_pieces(size_t i) const;  // this rank's, of parameter i
  int64_t param_numel(size_t i) const;  // n_i, also while released
  bool all_released() const;             // no parameter is whole
  const std::vector<at::Tensor>& grad_shards() const { return grad_shards_; }  // [S_i] each

  // Zeros the gradient shards (start of a step).
  void zero_grads();

  // LayerParameterHooks (decoder layer l).
  void gather_layer(int64_t layer) override { gather_unit(layer); }
  void release_layer(int64_t layer) override { release_unit(layer); }
  void reduce_layer(int64_t layer) override { reduce_unit(layer); }

  // Stage 3: makes every parameter of `unit` whole (a no-op for those already whole); stage 2:
  // nothing. release_unit: back to [0] (stage 3; not while gather_all holds them).
  // Prefetch: gather_unit then starts the gather of the unit that comes next in the order above
  // (forward: embedding -> layer 0 -> ... -> layer L-1 -> head; backward: head -> layer L-1 ->
  // ... -> layer 0), told apart by the unit gathered before, so the next unit's all-gathers run
  // while this one computes; gather_unit of that unit then only waits for them. At most one
  // unit is in flight (two units whole at a time, as DeepSpeed's prefetch of one module); a
  // prefetch nobody asks for is finished and released by the next gather_unit, set_weights or
  // release_all, so no full copy outlives the step.
  void gather_unit(int64_t unit);
  void release_unit(int64_t unit);
  // Gathers satisfied by a prefetch so far (tests; a sequence above gives 2L + 1 per micro-batch).
  int64_t prefetch_hits() const { return prefetch_hits_; }
  // Reduce-scatters the pending gradients of `unit`'s parameters into their shards and frees them.
  // The reduce-scatters run while the caller goes on (the backward of the unit before): this call
  // first waits for the previous unit's, adds them into their shards and frees their pending
  // buffers, then starts this unit's. At most one unit's reductions are in flight.
  void reduce_unit(int64_t unit);
  // Reduces the embedding's gradient and waits for every reduction: the shards are then complete.
  void reduce_pending();
  // Called as reductions complete (in reduce_unit, for the unit reduced before, and in
  // reduce_pending), on the thread that runs them, with the parameters whose shards just received
  // a unit's sum (each once, in unit order). A parameter of two units (a tied embedding: the
  // embedding's and the head's) is reported once per unit: its shard is final for the
  // micro-batch after reductions_per_micro_batch(i) reports. Empty: none.
  using ReducedFn = std::function<void(const std::vector<size_t>& params)>;
  void set_on_reduced(ReducedFn on_reduced) { on_reduced_ = std::move(on_reduced); }
  int64_t reductions_per_micro_batch(size_t i) const;
  // reduce_unit calls that found the previous unit's reductions still in flight, i.e. overlapped
  // with a backward (tests; a sequence above gives L + 1 per micro-batch).
  int64_t overlapped_reductions() const { return overlapped_reductions_; }

  // Stage 3: every parameter whole until release_all() (tests compare the gathered model).
  void gather_all();
  void release_all();
  // Stage 3: the gathers and releases of one forward over the units (the embedding, the layers,
  // the head), with nothing computed: a rank that takes no part in a computation the others run
  // unit by unit (evaluation without SP) keeps the world's collectives paired.
  void walk_units();
  // The most bytes of gathered weights (whole parameters and a prefetch's buffers) held at once
  // since construction or the last reset, as of each gather_unit (tests: a forward holds two
  // units at a time).
  int64_t peak_whole_bytes() const { return peak_whole_bytes_; }
  void reset_peak_whole_bytes() { peak_whole_bytes_ = 0; }

  // The embedding unit: input_ids [bs, T] -> [bs, T, h]. Gathers the weight, looks up, releases;
  // backward adds the weight's gradient into its pending buffer (reduced by reduce_pending()).
  at::Tensor embed(const at::Tensor& input_ids);

  // This rank's shard of parameter i's current values ([S_i], the parameter's dtype; zero
  // padding): in stage 3 the weight shard itself (the optimizer may alias it as its master when
  // the dtypes match), in stage 2 a fresh copy.
  at::Tensor weight_values(size_t i) const;
  // Writes updated shards (masters[i] [S_i], any float dtype) into the weights: stage 3 into the
  // weight shards (nothing to do for a master that is the shard itself), stage 2 all-gathered
  // (bucketed) into the whole parameters. Starts with begin_weight_update(). `uploads`, when
  // given, counts the copies from another device than the weights' (blocking, one per parameter
  // in stage 3, one per part in stage 2).
  void set_weights(const std::vector<at::Tensor>& masters, UploadStats* uploads = nullptr);
  // Stage 3: finishes a prefetch in flight (it reads the weight shards) and checks that no
  // parameter is gathered; call it before writing the weight shards in place. Stage 2: nothing.
  void begin_weight_update();
  // Where an optimizer may leave this rank's updated shard of parameter i for set_weights ([S_i],
  // the weights' dtype and device), so that set_weights copies nothing and converts nothing:
  // stage 3 the weight shard itself; stage 2 the gradient shard's memory from its start, viewed in
  // the weights' dtype (never wider than the gradients'), which holds nothing live from the
  // optimizer step until zero_grads(). Writing element j there overwrites gradient elements up to
  // j only: a stage-2 writer must have read the gradient's elements [0, j] before it writes
  // element j (AdamW does, with device gradients or stage_host_parameters: each piece of the
  // gradient reaches the host before that piece's weights are written).
  at::Tensor update_target(size_t i) const;
  // Recomputes the weight shards of the parameters that are whole from their values (after
  // loading whole weights); a released parameter's shard is its value already.
  void reshard_from_params();
  // Stage 3: rewrites this rank's weight shards (in place) from `fill` (a sharded load: only this
  // rank's elements are read). REQUIRES: every parameter released.
  void fill_shards(const ShardFill& fill);

  // Stage 3, collective: part k of parameter i all-gathered: [world * P_i] in the weights' dtype
  // and device, elements [k * world * P_i, ...) of the flattened parameter (past n_i: padding).
  // A streamed save gathers a parameter part by part, so that no rank holds more than one bucket
  // of it.
  at::Tensor gather_part(size_t i, int64_t k);
  int64_t part_count(size_t i) const { return shard_numel_[i] / part_numel_[i]; }
  const std::vector<int64_t>& shape(size_t i) const { return shapes_[i]; }
  at::ScalarType weight_dtype(size_t i) const;

  // Bytes this rank holds for weights (whole parameters or shards) and gradient shards.
  int64_t weight_bytes() const;
  int64_t grad_bytes() const;

  // Adds one gradient contribution of parameter i ([param shape], any float dtype) into its
  // pending buffer. Called by the hooks and by embed()'s backward.
  void accumulate(size_t i, const at::Tensor& grad);

 private:
  const std::vector<size_t>& unit_params(int64_t unit) const;

  // A unit's all-gathers in flight (stage 3 prefetch).
  struct UnitGather {
    int64_t unit = 0;
    std::vector<size_t> members;   // parameters being gathered (not whole when started)
    std::vector<at::Tensor> fulls; // [world * S_i] per member
    std::vector<comm::Group::Pending> parts;  // one all-gather per part, into its place
  };
  UnitGather start_gather(int64_t unit);  // issues the bucketed all-gathers of unit's members
  void finish_gather(UnitGather& g);      // waits for them; the members become whole
  // The unit gather_unit(unit) prefetches after `unit`, given the unit gathered before it; or
  // kNoUnit.
  int64_t next_unit(int64_t unit, int64_t previous) const;
  // Finishes an in-flight prefetch and releases its unit (unless pinned).
  void settle_prefetch();
  static constexpr int64_t kNoUnit = INT64_MIN;
  at::Tensor param_slice(size_t i) const;  // [S_i] fresh copy of the whole parameter's shard
  // Records the parameters (names, shapes, units, S_i and P_i for weights of `weight_dtype`, or of
  // each parameter's own), allocates the gradient shards (`grad_options`, or each parameter's
  // device with its accumulation dtype) and installs the gradient hooks. Shared by both
  // constructors.
  void add_parameters(const std::optional<at::TensorOptions>& grad_options,
                      std::optional<at::ScalarType> weight_dtype);

  model::LlamaForCausalLM& model_;
  comm::Group& world_;
  int stage_;
  int64_t bucket_bytes_;
  bool pinned_ = false;                    // gather_all holds every parameter whole
  std::vector<at::Tensor> params_;         // [param shape] or [0] while released
  std::vector<std::string> names_;
  std::vector<std::vector<int64_t>> shapes_;
  std::vector<int64_t> shard_numel_;       // S_i
  std::vector<int64_t> part_numel_;        // P_i, which divides S_i
  std::vector<bool> whole_;                // params_[i] holds its whole value
  std::vector<at::Tensor> weight_shards_;  // [S_i] param dtype (stage 3)
  std::vector<at::Tensor> grad_shards_;    // [S_i] fp32 / fp64
  std::vector<at::Tensor> pending_;        // [world * S_i] fp32 / fp64, or undefined
  std::vector<std::vector<size_t>> layer_units_;
  std::vector<size_t> embedding_unit_, head_unit_;
  size_t embedding_index_ = 0;
  // A reduce-scatter in flight: parameter i's shard elements [o, o + n) receive `work`'s result.
  struct Reduction {
    size_t i;
    int64_t o, n;
    comm::Group::Pending work;
  };
  // Waits for the reductions in flight and adds their results into the shards.
  void finish_reductions();
  std::vector<Reduction> reductions_;    // the last reduced unit's, until finish_reductions
  ReducedFn on_reduced_;
  int64_t overlapped_reductions_ = 0;
  std::optional<UnitGather> in_flight_;  // stage 3: the prefetched unit, at most one
  int64_t last_gathered_ = kNoUnit;      // the unit gather_unit was last called for
  int64_t prefetch_hits_ = 0;
  int64_t peak_whole_bytes_ = 0;
};

}  // namespace ulysses::train
