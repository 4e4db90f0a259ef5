// The per-rank training loop (see trainer.h). The only long file by design.
#include "train/trainer.h"

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <stdexcept>

#include "common/error.h"
#include "config/mesh_factors.h"
#include "config/run_config.h"
#include "data/data_loader.h"
#include "memory/activation_checkpoint.h"
#include "memory/memory_limit.h"
#include "memory/memory_stats.h"
#include "memory/precision.h"
#include "model/attention_core.h"
#include "model/hf_weights.h"
#include "model/materialize.h"
#include "model/weight_init.h"
#include "profile/flops.h"
#include "profile/model_ranges.h"
#include "profile/phase_timer.h"
#include "sp/tiled_logits_loss.h"
#include "sp/tiled_mlp.h"
#include "sp/ulysses_attention.h"
#include "optim/adamw.h"
#include "optim/cpu_adam.h"
#include "train/checkpoint.h"
#include "train/evaluator.h"
#include "zero/gradient_step.h"
#include "zero/grad_buffers.h"
#include "zero/layer_all_reduce.h"
#include "zero/overlapped_host_update.h"
#include "zero/overlapped_shard_update.h"
#include "optim/grad_clip.h"
#include "optim/lr_schedule.h"
#include "train/metrics.h"
#include "train/run_description.h"
#include "zero/zero_optimizer.h"
#include "zero/zero_partition.h"

namespace ulysses::train {
namespace {

std::vector<data::Batch> load_step(const data::DataLoader& loader, int64_t step,
                                   int64_t grad_accum, const at::Device& device) {
  std::vector<data::Batch> batches;
  for (int64_t m = 0; m < grad_accum; ++m) {
    data::Batch b = loader.micro_batch(step, m);
    b.input_ids = b.input_ids.to(device);
    b.labels = b.labels.to(device);
    b.position_ids = b.position_ids.to(device);
    if (b.doc_ids.defined()) b.doc_ids = b.doc_ids.to(device);  // b.documents stay on the host
    batches.push_back(std::move(b));
  }
  return batches;
}

void print_progress(int64_t step, int64_t total, const StepMetrics& m) {
  std::printf("step %lld/%lld  loss %.5f  grad_norm %.4f  lr %.3e  %.1f ms  %.0f tok/s  peak %.1f MiB\n",
              static_cast<long long>(step), static_cast<long long>(total), m.loss, m.grad_norm,
              m.lr, m.step_ms, m.tokens_per_s, m.peak_mem_bytes / (1024.0 * 1024.0));
  std::fflush(stdout);
}

std::string step_dir(const std::string& dir, int64_t step) {
  return (std::filesystem::path(dir) / ("step-" + std::to_string(step))).string();
}

void say(const std::string& line) { std::cout << "ulysses-train: " << line << std::endl; }

// One line on what the data of `key` (data.source, eval.source) applies beyond its tokens: the
// loss mask it reads and how whole documents were packed; "" when neither.
std::string describe_data(const std::string& key, const std::string& loss_mask,
                          const std::optional<data::PackingCounts>& packing,
                          const config::DataOptions& options, int64_t length) {
  std::string line;
  if (!loss_mask.empty()) {
    line = key + ": loss mask " + loss_mask + " (labels of tokens it marks 0 are ignored)";
  }
  if (packing) {
    const data::PackingCounts& c = *packing;
    const double padding = c.samples > 0 ? 100.0 * static_cast<double>(c.padding_tokens) /
                                               static_cast<double>(c.samples * length)
                                         : 0.0;
    char percent[32];
    std::snprintf(percent, sizeof(percent), "%.1f%%", padding);
    line += (line.empty() ? key + ": " : std::string("; ")) + "data.packing documents: " +
            std::to_string(c.documents) + " documents in " + std::to_string(c.samples) +
            " samples of " + std::to_string(length) + " tokens, " + std::to_string(c.truncated) +
            " truncated, " + std::to_string(c.dropped) + " dropped (data.overlong: " +
            options.overlong + "), " + percent + " padding";
  }
  return line;
}

// Writes `config` to <output.dir>/run.yaml (through a temporary name). Throws UserError.
void write_run_yaml(const config::RunConfig& config, const std::string& path) {
  {
    std::ofstream out(path + ".tmp", std::ios::trunc);
    out << "# The effective run config of this run (ulysses-train --config " << "run.yaml runs it again)\n"
        << config::to_yaml(config);
    if (!out) throw UserError("output.dir: cannot write " + path);
  }
  std::error_code ec;
  std::filesystem::rename(path + ".tmp", path, ec);
  if (ec) throw UserError("output.dir: cannot write " + path + " (" + ec.message() + ")");
}

}  // namespace

at::Device select_device(const config::RunConfig& config, const comm::DistEnv& env) {
  if (config.train.device == "cpu") return at::Device(at::kCPU);
  if (!at::hasCUDA()) {
    throw UserError("train.device: cuda requested but this LibTorch build or machine has no CUDA");
  }
  int64_t index = env.local_rank;
  // Gloo (asked for by name) can run several ranks on one GPU, for correctness runs on a machine
  // with fewer GPUs than ranks; NCCL cannot, so the mesh refuses a LOCAL_RANK beyond the GPUs.
  const int64_t gpus = static_cast<int64_t>(at::getNumGPUs());
  if (config.comm.backend == "gloo" && gpus > 0) index %= gpus;
  // One visible device (SLURM's --gpus-per-task=1 or --gpu-bind=single:1, or CUDA_VISIBLE_DEVICES
  // set per rank): it is this rank's, whatever LOCAL_RANK says. Two NCCL ranks on one device are
  // refused by NCCL itself.
  if (gpus == 1) index = 0;
  return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(index));
}

model::LlamaForCausalLM build_model(const config::RunConfig& config, comm::DeviceMesh& mesh,
                                    const at::Device& device, int64_t* mlp_tiles,
                                    bool shapes_only) {
  model::LlamaForCausalLM model(config.model, shapes_only ? model::WeightInit::kShapesOnly
                                                          : model::WeightInit::kDeferred);
  if (!shapes_only) {
    model::materialize_weights(model, device, memory::parameter_dtype(config.memory.precision),
                               config.model.load);
  }
  const model::AttentionBackend backend =
      model::resolve_attention_backend(config.attention.backend, device);
  if (mesh.sp_size() > 1) {
    const int64_t sp_ring = config::resolved_sp_ring(config.mesh, config.model.num_heads,
                                                     config.model.num_kv_heads);
    if (mesh.sp_ring_size() != sp_ring) {
      throw UserError("mesh.sp_ring: the run resolves it to " + std::to_string(sp_ring) +
                      " but the process mesh was built with " +
                      std::to_string(mesh.sp_ring_size()));
    }
    model->set_attention_core(std::make_shared<sp::UlyssesAttention>(
        mesh.sp_a2a(), backend, config.mesh.uneven_heads, &mesh.sp_ring()));
  } else {
    model->set_attention_core(std::make_shared<model::LocalAttentionCore>(backend));
  }
  model->set_skip_all_but_last(config.attention.skip_all_but_last);
  int64_t tiles = 1;
  if (config.memory.tiled_mlp.value != 1) {  // TiledMLP; auto is a MAX over the world
    const int64_t multiple = config::sequence_multiple(mesh.sp_size(), mesh.sp_ring_size());
    const int64_t local_seq_len =
        (config.sequence.length + multiple - 1) / multiple * multiple / mesh.sp_size();
    tiles = sp::resolve_mlp_tiles(config.memory.tiled_mlp, local_seq_len,
                                  model->options().hidden_size, mesh.world());
    model->set_mlp_runner(sp::tiled_mlp_runner(tiles));
  }
  if (mlp_tiles != nullptr) *mlp_tiles = tiles;
  // memory.offload_activations offloads the checkpointed inputs, so it implies checkpointing.
  if (config.memory.checkpointing || config.memory.offload_activations) {
    memory::enable_activation_checkpointing(model, config.memory.offload_activations);
  }
  return model;
}

ZeroPartition::ShardFill shard_source(const config::ModelOptions& options,
                                      model::LlamaForCausalLM& model) {
  if (options.load.empty()) {
    const uint64_t seed = model->options().init_seed;
    const double std = model->options().init_std;
    return [seed, std](size_t index, const std::string& name, at::IntArrayRef shape,
                       int64_t begin, at::Tensor out) {
      model::init_weight_range(index, name, shape, seed, std, begin, out);
    };
  }
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
  for (const auto& item : model->named_parameters()) {
    shapes.emplace_back(item.key(), item.value().sizes().vec());
  }
  auto index = std::make_shared<model::HfWeightIndex>(options.load, shapes,
                                                      model->options().tie_embeddings);
  return [index](size_t, const std::string& name, at::IntArrayRef, int64_t begin, at::Tensor out) {
    index->read(name, begin, out);
  };
}

int run_training(const config::RunConfig& config, comm::DeviceMesh& mesh,
                 const at::Device& device) {
  const bool is_rank0 = mesh.rank() == 0;
  ResolvedRun run;
  // zero.stage 1-3 shard AdamW over the world; in a world of 1 every stage is stage 0.
  const int zero_stage = mesh.world().size() > 1 ? static_cast<int>(config.zero.stage) : 0;
  // Stage 3 on a CPU: the host heap is the training memory, and the units' gathers and gradient
  // buffers come and go every step; blocks of 256 KiB and more get mappings of their own, so that
  // what is freed leaves the resident set (memory_limit.h).
  if (zero_stage == 3 && device.is_cpu()) memory::fix_host_mmap_threshold(int64_t{256} << 10);
  // Stage 3 never builds the whole model: each rank draws or loads its own shards only.
  model::LlamaForCausalLM model =
      build_model(config, mesh, device, &run.mlp_tiles, /*shapes_only=*/zero_stage == 3);
  profile::set_timing_device(device);
  profile::enable_nvtx(config.profile.nvtx);
  const OptimizerPlacement placement = config.memory.offload_optimizer
                                           ? OptimizerPlacement::kHost
                                           : OptimizerPlacement::kDevice;
  config::OptimOptions optim = config.optim;  // host_threads resolved
  optim.host_threads =
      resolve_host_threads(config.optim.host_threads, !device.is_cuda(), at::get_num_threads(),
                           available_host_cpus(), mesh.local_world_size());
  const int64_t bucket_bytes =
      std::max<int64_t>(static_cast<int64_t>(config.zero.bucket_mb * 1024.0 * 1024.0), 1);
  // zero.stage 2/3: per-parameter shards of the gradients (and weights: 3); every layer runs
  // through the partition's runner (stage 3 always recomputes in backward, see
  // activation_checkpoint.h), which replaces build_model's checkpointing runner.
  std::shared_ptr<ZeroPartition> partition;
  if (zero_stage == 3) {
    const at::TensorOptions weights =
        at::TensorOptions(memory::parameter_dtype(config.memory.precision)).device(device);
    partition = std::make_shared<ZeroPartition>(model, mesh.world(), bucket_bytes, weights,
                                                shard_source(config.model, model));
  } else if (zero_stage == 2) {
    partition = std::make_shared<ZeroPartition>(model, mesh.world(), zero_stage, bucket_bytes);
  }
  if (zero_stage >= 2) {
    const bool recompute = zero_stage == 3 || config.memory.checkpointing ||
                           config.memory.offload_activations;
    memory::enable_layer_hooks(model, config.memory.offload_activations, recompute, partition);
  }
  std::vector<at::Tensor> params = model->parameters();
  // memory.precision bf16-states: bf16 gradient sums and AdamW states, no masters (validation
  // refuses it elsewhere; runs that skip validation hear it here).
  const bool states_in_param_dtype = memory::states_in_parameter_dtype(config.memory.precision);
  if (states_in_param_dtype && (config.zero.stage != 0 || placement == OptimizerPlacement::kHost)) {
    throw UserError("memory.precision: bf16-states needs zero.stage 0 and memory.offload_optimizer "
                    "false (ZeRO stages 1-3 and the offloaded optimizer keep fp32 masters)");
  }
  // fp32 accumulation buffers for the whole run (bf16 parameters' gradients are summed there;
  // bf16-states: bf16 buffers, each parameter's .grad() itself),
  // padded to a multiple of the world for ZeRO's shards; none under stage 2/3 (the partition
  // holds shard-sized gradients).
  // Under optimizer offload (stage 0) they live on the host, where the update reads them: no
  // fp32 gradient on the device; with memory.offload_gradients false they stay on the device and
  // the host update streams them.
  const bool host_gradients = zero_stage == 0 && placement == OptimizerPlacement::kHost &&
                              config.memory.offload_gradients;
  GradientBuffers gradients(zero_stage >= 2 ? std::vector<at::Tensor>{} : params,
                            zero_stage > 0 ? mesh.world().size() : 1, host_gradients,
                            states_in_param_dtype);
  // Stages 0 and 1 over several ranks with the gradients on the device: each layer's sum over
  // the world starts as soon as its backward of the step's last micro-batch is done, while the
  // layers below compute (the layer hooks take over build_model's checkpointing runner, recompute
  // and offload included).
  std::shared_ptr<LayerAllReduce> layer_all_reduce;
  if (zero_stage <= 1 && mesh.world().size() > 1 && !host_gradients) {
    layer_all_reduce =
        std::make_shared<LayerAllReduce>(model, gradients, mesh.world(), bucket_bytes);
    memory::enable_layer_hooks(model, config.memory.offload_activations,
                               config.memory.checkpointing || config.memory.offload_activations,
                               layer_all_reduce);
  }
  std::unique_ptr<AdamW> adamw;        // zero.stage 0
  std::unique_ptr<ZeroOptimizer> zero;  // zero.stage 1, 2, 3
  if (zero_stage >= 2) {
    zero = std::make_unique<ZeroOptimizer>(*partition, optim, placement);
  } else if (zero_stage > 0) {
    zero = std::make_unique<ZeroOptimizer>(gradients, mesh.world(), optim, placement,
                                           bucket_bytes);
  } else {
    adamw = std::make_unique<AdamW>(
        model->named_parameters().pairs(), optim, placement, std::vector<at::Tensor>{},
        states_in_param_dtype ? AdamWStates::kParameterDtype : AdamWStates::kFp32Masters);
  }
  // optim.overlap_host_update (the optimizer and the gradients it reads on the host; auto: on a
  // GPU): each parameter's (ZeRO: each shard's) host update runs beside backward once its
  // gradient is final. Stage 0: in a world of 1 after its layer's backward of the last
  // micro-batch (the layer hooks take over build_model's checkpointing runner, recompute and
  // offload included), in a larger one after its sum. Stages 1-3: once its reduction has landed.
  std::shared_ptr<OverlappedHostUpdate> host_update;
  std::unique_ptr<OverlappedShardUpdate> shard_update;
  const std::string& overlap_option = config.optim.overlap_host_update;
  if (overlap_option != "false") {
    // Why the overlap cannot run here, or empty.
    std::string unable;
    if (placement != OptimizerPlacement::kHost) {
      unable = "needs memory.offload_optimizer (it overlaps the offloaded optimizer's host update)";
    } else if (zero_stage == 0 && !host_gradients) {
      unable = "needs memory.offload_gradients at zero.stage 0 (the host update reads the "
               "gradients where they were summed, in host memory)" +
               std::string(config.zero.stage != 0 ? "; a world of 1 runs every stage as 0" : "");
    } else if (zero && !zero->overlap_applies()) {
      unable = "needs the gradient shards in host memory, and at zero.stage " +
               std::to_string(zero_stage) + " on " + device.str() + " they stay on the device";
    }
    if (!unable.empty() && overlap_option == "true") {
      throw UserError("optim.overlap_host_update: true " + unable + "; set it to false or auto");
    }
    if (unable.empty() && (overlap_option == "true" || device.is_cuda())) {  // auto: on a GPU
      if (zero) {
        shard_update = std::make_unique<OverlappedShardUpdate>(*zero, optim.host_threads);
      } else {
        host_update = std::make_shared<OverlappedHostUpdate>(
            model, gradients, *adamw, mesh.world().size(), optim.host_threads);
        if (mesh.world().size() == 1) {
          memory::enable_layer_hooks(
              model, config.memory.offload_activations,
              config.memory.checkpointing || config.memory.offload_activations, host_update);
        }
      }
    }
  }
  profile::install_model_ranges(model);  // around the runners installed so far
  data::DataLoader loader(config.data, config.sequence, config.model.vocab_size, mesh.dp_size(),
                          mesh.dp_rank(), mesh.sp_size(), mesh.sp_rank(), "data.source",
                          mesh.sp_ring_size());
  const int64_t global_samples = loader.global_batch_size();
  const int64_t tokens_per_step = global_samples * loader.padded_length();

  // Checkpoints: clear what an interrupted save left, before any rank writes.
  const bool checkpoints = !config.checkpoint.dir.empty();
  if (checkpoints) {
    if (is_rank0) {
      for (const auto& name : remove_stale_checkpoint_temps(config.checkpoint.dir)) {
        say("removed " + name + " (left in " + config.checkpoint.dir + " by an interrupted save)");
      }
    }
    mesh.world().barrier();
  }

  TrainerState state;
  state.data_seed = config.data.seed;
  state.train_seed = config.train.seed;
  std::string resume_note;
  const std::string resume_dir = resolve_resume_dir(config.checkpoint, &resume_note);
  if (is_rank0 && !resume_note.empty()) say(resume_note);
  if (!resume_dir.empty()) {
    state = load_checkpoint(resume_dir, model, adamw.get(), zero.get());
    model->to(device);
    if (state.step >= config.train.steps) {  // finished: nothing to train, keep its outputs
      if (is_rank0) {
        say("checkpoint " + resume_dir + " is at step " + std::to_string(state.step) +
            " and train.steps is " + std::to_string(config.train.steps) +
            ": nothing left to train, outputs in " + config.output.dir +
            " left as they are (raise train.steps to train on)");
      }
      return kExitOk;
    }
    loader.continue_from(state.step + 1, state.samples_seen);
    if (is_rank0) {
      say("resumed from " + resume_dir + " at step " + std::to_string(state.step) +
          ", data at sample " + std::to_string(state.samples_seen));
      const bool mesh_changed =
          state.dp != 0 && (state.dp != mesh.dp_size() || state.sp != mesh.sp_size());
      if (mesh_changed || (state.global_batch != 0 && state.global_batch != global_samples)) {
        say("resuming on dp " + std::to_string(mesh.dp_size()) + " x sp " +
            std::to_string(mesh.sp_size()) + " with " + std::to_string(global_samples) +
            " samples per step (checkpoint: dp " + std::to_string(state.dp) + " x sp " +
            std::to_string(state.sp) + ", " + std::to_string(state.global_batch) +
            "): the data continues at sample " + std::to_string(state.samples_seen));
      }
    }
  }
  if (state.run_id.empty()) state.run_id = new_run_id();  // a fresh run, or an older checkpoint
  state.global_batch = global_samples;
  state.dp = mesh.dp_size();
  state.sp = mesh.sp_size();
  if (checkpoints && config.checkpoint.save_initial && state.step == 0) {
    const std::string initial = (std::filesystem::path(config.checkpoint.dir) / "initial").string();
    save_checkpoint(initial, model, config.model, nullptr, state, mesh.world(), nullptr,
                    config.checkpoint.overwrite, partition.get());
    if (is_rank0) say("saved initial weights to " + initial);
  }

  run.world_size = mesh.world().size();
  run.dp = mesh.dp_size();
  run.sp = mesh.sp_size();
  run.padded_length = loader.padded_length();
  run.local_length = loader.local_length();
  run.global_batch = global_samples;
  run.loss_tiles = config.memory.tiled_loss.value == 1
                       ? 1
                       : sp::resolve_loss_tiles(config.memory.tiled_loss,
                                                config.sequence.micro_batch, loader.local_length(),
                                                config.model.vocab_size);
  if (partition) {  // stage 3: the parameters hold nothing between uses
    for (size_t i = 0; i < partition->params().size(); ++i) {
      run.parameters += partition->param_numel(i);
    }
  } else {
    for (const auto& p : params) run.parameters += p.numel();
  }
  run.device = device.str();
  run.attention = model->attention_core()->name();
  if (placement == OptimizerPlacement::kHost) run.host_threads = optim.host_threads;

  std::unique_ptr<MetricsWriter> metrics;
  const std::string run_yaml = (std::filesystem::path(config.output.dir) / "run.yaml").string();
  if (is_rank0) {
    metrics = std::make_unique<MetricsWriter>(config.output.dir, config.profile.warmup_steps,
                                              state.step);
    metrics->set_throughput_basis(mesh.world().size(), config.profile.peak_tflops > 0
                                                           ? config.profile.peak_tflops * 1e12
                                                           : profile::peak_flops_per_rank_from_env());
    write_run_yaml(config, run_yaml);
    std::cout << describe_run(config, run, run_yaml) << std::flush;
    const std::string data_line =
        describe_data("data.source", loader.loss_mask_prefix(), loader.packing_counts(),
                      config.data, config.sequence.length);
    if (!data_line.empty()) say(data_line);
    if (metrics->kept_steps() > 0) {
      say("appending to " + config.output.dir + "/metrics.jsonl after its " +
          std::to_string(metrics->kept_steps()) + " records of steps <= " +
          std::to_string(state.step));
    }
  }
  const double step_flops =
      tokens_per_step * profile::training_flops(config.model, loader.padded_length()).per_token();
  const bool evaluating = !config.eval.source.empty();

  std::optional<data::PackingCounts> eval_packing;  // of the last evaluation, for summary.json
  bool eval_data_said = false;
  auto run_eval = [&](int64_t step) {
    EvalResult result = evaluate(model, config, mesh, device, partition.get());
    if (partition) partition->release_all();  // stage 3: a safety net, nothing should remain
    if (is_rank0 && !eval_data_said) {  // once: every evaluation reads the same data
      const std::string line = describe_data("eval.source", result.loss_mask, result.packing,
                                             config.data, config.sequence.length);
      if (!line.empty()) say(line);
      eval_data_said = true;
    }
    eval_packing = result.packing;
    if (is_rank0) {
      nlohmann::json record = result.to_json();
      record["step"] = step;
      if (metrics) metrics->write_eval(record);
      std::printf("eval after step %lld  loss %.5f  ppl %.3f  tokens %lld\n",
                  static_cast<long long>(step), result.loss, result.perplexity,
                  static_cast<long long>(result.tokens));
      std::fflush(stdout);
    }
  };

  if (partition) partition->release_all();  // stage 3: only shards from here on
  int64_t consecutive_skips = 0;
  // Running maxima over every step of this run (the per-step peaks are reset at each step).
  memory::DeviceMemory run_memory;
  int64_t run_peak_mem_bytes = 0;
  // The offloaded optimizer's host time before the end of backward (overlapped) and its wall time
  // after it, over every step of this run (summary.json's optimizer_overlap).
  double optimizer_ms_after_backward = 0.0;
  const int64_t first_step = state.step + 1;
  for (int64_t step = state.step + 1; step <= config.train.steps; ++step) {
    profile::ScopedRange step_range("step", step);  // nsys capture range: step@ulysses
    memory::reset_peak_device_bytes(device);
    profile::take_phase_times();  // drop anything accumulated between steps
    const auto start = std::chrono::steady_clock::now();
    std::vector<data::Batch> batches = load_step(loader, step, config.sequence.grad_accum, device);
    GradientOptions gradient_options{config.memory.tiled_loss, &gradients, bucket_bytes};
    gradient_options.reduce = zero == nullptr;
    gradient_options.partition = partition.get();
    gradient_options.layer_all_reduce = layer_all_reduce.get();
    gradient_options.host_update = host_update.get();
    gradient_options.shard_update = shard_update.get();
    const double lr = lr_at(config.optim, step, config.train.steps);
    if (host_update) host_update->begin_step(lr);
    if (shard_update) shard_update->begin_step(lr);
    StepLoss loss = compute_gradients(model, batches, mesh, gradient_options);
    if (zero) {
      zero->reduce_gradients(shard_update ? shard_update->on_summed()
                                          : GradientBuffers::SummedFn());
    }
    const auto optimizer_start = std::chrono::steady_clock::now();
    double grad_norm = 0.0;
    // Gradients are summed over the world before the norm, so every rank takes the same branch.
    bool skipped = false;
    if (shard_update) {  // what ran ahead commits, is redone or undone; then zero_gather
      const OverlappedShardUpdate::Result result =
          shard_update->finish_step(config.optim.grad_clip, lr);
      grad_norm = result.grad_norm;
      skipped = result.skipped;
    } else if (zero) {  // optimizer phase inside; zero_gather after it
      grad_norm = zero->clip(config.optim.grad_clip);
      skipped = !std::isfinite(grad_norm);
      if (!skipped) zero->step(lr);
    } else {
      profile::ScopedPhase phase("optimizer");
      if (host_update) {
        // What ran ahead commits, is redone with the clip factor, or is undone (not finite).
        const OverlappedHostUpdate::Result result = host_update->finish_step(config.optim.grad_clip);
        grad_norm = result.grad_norm;
        skipped = result.skipped;
      } else if (placement == OptimizerPlacement::kHost) {
        // Clipping folded into the host update: the gradients (on the host, read in place, or
        // on the device, streamed) are never rewritten. The norm of host gradients is one pass
        // over them on the host pass's threads.
        {
          profile::ScopedPhase part("optimizer_norm", profile::Category::kOptimizer);
          grad_norm = host_gradients || device.is_cpu()
                          ? host_gradient_norm(gradients.grads(), optim.host_threads)
                          : gradient_norm(gradients.grads());
        }
        skipped = !std::isfinite(grad_norm);
        const double scale = clip_coefficient(grad_norm, config.optim.grad_clip);
        if (!skipped) adamw->step(lr, gradients.grads(), scale);
      } else {
        {
          profile::ScopedPhase part("optimizer_norm", profile::Category::kOptimizer);
          // bf16-states: clip_grad_norm_'s own bf16 arithmetic, as the transformers run it matches.
          grad_norm = states_in_param_dtype
                          ? clip_gradients_as_torch(gradients.grads(), config.optim.grad_clip)
                          : clip_gradients(gradients.grads(), config.optim.grad_clip);
        }
        skipped = !std::isfinite(grad_norm);
        if (!skipped) adamw->step(lr, gradients.grads());
      }
    }
    optimizer_ms_after_backward += std::chrono::duration<double, std::milli>(
                                       std::chrono::steady_clock::now() - optimizer_start)
                                       .count();
    consecutive_skips = skipped ? consecutive_skips + 1 : 0;
    if (skipped) ++state.skipped_steps;
    if (device.is_cuda()) torch::cuda::synchronize(device.index());
    const double step_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    state.step = step;
    state.samples_seen += global_samples;

    StepMetrics m;
    m.step = step;
    m.loss = loss.loss;
    m.grad_norm = grad_norm;
    m.lr = lr;
    m.tokens = tokens_per_step;
    m.valid_tokens = loss.valid_tokens;
    m.step_ms = step_ms;
    m.tokens_per_s = tokens_per_step / (step_ms / 1000.0);
    m.peak_host_bytes = memory::peak_host_bytes();
    const memory::DeviceMemory step_memory = memory::device_memory(device);
    m.peak_mem_bytes = device.is_cuda() ? step_memory.footprint() : m.peak_host_bytes;
    run_memory.peak_allocated = std::max(run_memory.peak_allocated, step_memory.peak_allocated);
    run_memory.peak_reserved = std::max(run_memory.peak_reserved, step_memory.peak_reserved);
    run_memory.outside_allocator =
        std::max(run_memory.outside_allocator, step_memory.outside_allocator);
    run_peak_mem_bytes = std::max(run_peak_mem_bytes, m.peak_mem_bytes);
    m.set_times(profile::take_step_times());
    m.model_flops = step_flops;
    m.skipped = skipped;
    m.first_sample = loader.first_sample(step);
    if (is_rank0) {
      metrics->write_step(m);
      print_progress(step, config.train.steps, m);
      if (skipped) {
        say("step " + std::to_string(step) + ": grad_norm is not finite, update skipped (" +
            std::to_string(consecutive_skips) + " in a row)");
      }
    }
    if (config.optim.max_consecutive_skips > 0 &&
        consecutive_skips >= config.optim.max_consecutive_skips) {
      throw std::runtime_error(
          "training diverged: grad_norm was not finite in " + std::to_string(consecutive_skips) +
          " steps in a row (steps " + std::to_string(step - consecutive_skips + 1) + "-" +
          std::to_string(step) + ", optim.max_consecutive_skips " +
          std::to_string(config.optim.max_consecutive_skips) +
          "): lower optim.lr, raise optim.warmup_steps or check the data");
    }
    const bool last = step == config.train.steps;
    if (checkpoints && (last || (config.checkpoint.every > 0 && step % config.checkpoint.every == 0))) {
      const std::string dir = step_dir(config.checkpoint.dir, step);
      save_checkpoint(dir, model, config.model, adamw.get(), state, mesh.world(), zero.get(),
                      config.checkpoint.overwrite);
      if (is_rank0) say("saved checkpoint " + dir);
    }
    if (evaluating && (last || (config.eval.every > 0 && step % config.eval.every == 0))) {
      run_eval(step);
    }
  }
  if (evaluating && config.train.steps == 0) run_eval(0);  // evaluation-only run
  // The tuner compares peaks against a per-rank limit: the largest rank's peak over every step
  // (evaluation included) is what counts. On a CPU device the limit caps address space, not the
  // resident peak: that peak too, and whether some rank could not measure it.
  const memory::DeviceMemory last = memory::device_memory(device);  // since the last reset
  const int64_t host_peak = memory::peak_host_bytes();
  const std::optional<int64_t> address_space = memory::peak_address_space_above_baseline();
  at::Tensor peaks =
      at::tensor({host_peak,
                  std::max(run_peak_mem_bytes, device.is_cuda() ? last.footprint() : host_peak),
                  std::max(run_memory.peak_allocated, last.peak_allocated),
                  std::max(run_memory.peak_reserved, last.peak_reserved),
                  std::max(run_memory.outside_allocator, last.outside_allocator),
                  address_space.value_or(0), address_space ? int64_t{0} : int64_t{1}},
                 at::kLong)
          .to(device);  // [7]: host, counted peak, allocated, reserved, outside the allocator,
                        // address space above the baseline, unmeasured (0 or 1)
  mesh.world().all_reduce(peaks, comm::ReduceOp::kMax);
  peaks = peaks.cpu();
  if (is_rank0 && metrics) {
    nlohmann::json extra = resolved_run_json(config, run);
    if (device.is_cuda()) {
      extra.update({{"max_rank_peak_allocated_bytes", peaks[2].item<int64_t>()},
                    {"max_rank_peak_reserved_bytes", peaks[3].item<int64_t>()},
                    {"max_rank_outside_allocator_bytes", peaks[4].item<int64_t>()}});
    }
    if (peaks[6].item<int64_t>() == 0) {  // every rank measured its address space (CPU)
      extra["max_rank_peak_address_space_bytes"] = peaks[5].item<int64_t>();
    }
    extra.update({{"max_rank_peak_host_bytes", peaks[0].item<int64_t>()},
                  {"max_rank_peak_mem_bytes", peaks[1].item<int64_t>()},
                  {"world_size", mesh.world().size()},
                  {"dp", mesh.dp_size()},
                  {"sp", mesh.sp_size()},
                  {"sequence_length", loader.padded_length()},
                  {"device", device.str()},
                  {"attention_kernels", model::attention_kernels_used()}});
    if (const auto packing = loader.packing_counts()) {
      extra["data_packing"] = packing_counts_json(*packing);
    }
    if (eval_packing) extra["eval_data_packing"] = packing_counts_json(*eval_packing);
    if (!loader.loss_mask_prefix().empty()) extra["loss_mask"] = loader.loss_mask_prefix();
    if (placement == OptimizerPlacement::kHost) {
      // What the offloaded optimizer moved (rank 0): how the last step's updated weights went back
      // and how much of the host gradient was on the wire at once for the sum over the world.
      const UploadStats& up = zero ? zero->last_step_uploads() : adamw->last_step_uploads();
      extra["offload"] = {
          {"last_step_uploads",
           {{"staged", up.staged}, {"staged_bytes", up.staged_bytes},
            {"direct", up.direct}, {"direct_bytes", up.direct_bytes},
            {"blocking", up.blocking}, {"blocking_bytes", up.blocking_bytes}}},
          {"gradient_buckets_in_flight_max", gradients.host_buckets_in_flight_max()},
          {"gradient_bytes_in_flight_max", gradients.host_bytes_in_flight_max()}};
      // How much of the optimizer phase ran hidden behind backward (optim.overlap_host_update).
      // ZeRO: per shard (an AdamW entry: the flat buffer's shard at stage 1, a parameter's at 2
      // and 3) of rank 0.
      const double during = host_update    ? host_update->ms_before_backward_end()
                            : shard_update ? shard_update->ms_before_backward_end()
                                           : 0.0;
      const double total = during + optimizer_ms_after_backward;
      const int64_t ahead = host_update    ? host_update->last_step_updated_ahead()
                            : shard_update ? shard_update->last_step_updated_ahead()
                                           : 0;
      extra["optimizer_overlap"] = {
          {"overlapped", host_update != nullptr || shard_update != nullptr},
          {"steps", config.train.steps - first_step + 1},
          {"host_ms_during_backward", during},
          {"ms_after_backward", optimizer_ms_after_backward},
          {"hidden_fraction", total > 0.0 ? during / total : 0.0},
          {"last_step_updated_ahead", ahead},
          {"parameters", static_cast<int64_t>(params.size())}};
      if (zero) extra["optimizer_overlap"]["shards"] = zero->shard_optimizer().parameters().size();
    }
    metrics->write_summary(extra);
    say("done: outputs in " + config.output.dir + " (metrics.jsonl, summary.json, run.yaml)" +
        (checkpoints ? ", checkpoints in " + config.checkpoint.dir : std::string()));
  }
  return kExitOk;
}

}  // namespace ulysses::train
