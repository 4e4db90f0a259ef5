// The per-rank training loop (see trainer.h). The only long file by design (STYLE 10).
#include "train/trainer.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "common/error.h"
#include "data/data_loader.h"
#include "memory/activation_checkpoint.h"
#include "memory/memory_stats.h"
#include "memory/precision.h"
#include "model/attention_core.h"
#include "model/hf_weights.h"
#include "profile/flops.h"
#include "profile/model_ranges.h"
#include "profile/phase_timer.h"
#include "sp/tiled_mlp.h"
#include "sp/ulysses_attention.h"
#include "train/adamw.h"
#include "train/checkpoint.h"
#include "train/evaluator.h"
#include "train/gradient_step.h"
#include "train/grad_clip.h"
#include "train/lr_schedule.h"
#include "train/metrics.h"

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
    if (b.doc_ids.defined()) b.doc_ids = b.doc_ids.to(device);
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

}  // namespace

at::Device select_device(const config::RunConfig& config, const comm::DistEnv& env) {
  if (config.train.device == "cpu") return at::Device(at::kCPU);
  if (!at::hasCUDA()) {
    throw UserError("train.device: cuda requested but this LibTorch build or machine has no CUDA");
  }
  return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(env.local_rank));
}

model::LlamaForCausalLM build_model(const config::RunConfig& config, comm::DeviceMesh& mesh,
                                    const at::Device& device) {
  model::LlamaForCausalLM model(config.model);
  if (!config.model.load.empty()) model::load_hf_weights(model, config.model.load);
  model->to(device, memory::parameter_dtype(config.memory.precision));
  const model::AttentionBackend backend =
      model::resolve_attention_backend(config.attention.backend, device);
  if (mesh.sp_size() > 1) {
    model->set_attention_core(std::make_shared<sp::UlyssesAttention>(mesh.sp(), backend));
  } else {
    model->set_attention_core(std::make_shared<model::LocalAttentionCore>(backend));
  }
  model->set_skip_all_but_last(config.attention.skip_all_but_last);
  if (config.memory.tiled_mlp.value != 1) {  // TiledMLP; auto is a MAX over the world
    const int64_t local_seq_len = (config.sequence.length + mesh.sp_size() - 1) / mesh.sp_size();
    model->set_mlp_runner(sp::tiled_mlp_runner(sp::resolve_mlp_tiles(
        config.memory.tiled_mlp, local_seq_len, model->options().hidden_size, mesh.world())));
  }
  // memory.offload_activations offloads the checkpointed inputs, so it implies checkpointing.
  if (config.memory.checkpointing || config.memory.offload_activations) {
    memory::enable_activation_checkpointing(model, config.memory.offload_activations);
  }
  return model;
}

int run_training(const config::RunConfig& config, comm::DeviceMesh& mesh,
                 const at::Device& device) {
  const bool is_rank0 = mesh.rank() == 0;
  model::LlamaForCausalLM model = build_model(config, mesh, device);
  profile::set_timing_device(device);
  profile::enable_nvtx(config.profile.nvtx);
  profile::install_model_ranges(model);
  if (is_rank0) {
    std::cout << "ulysses-train: model " << (config.model.preset.empty() ? "inline" : config.model.preset)
              << ", " << model->parameters().size() << " tensors, attention "
              << model->attention_core()->name() << ", device " << device.str() << std::endl;
  }
  AdamW optimizer(model->named_parameters().pairs(), config.optim,
                  config.memory.offload_optimizer ? OptimizerPlacement::kHost
                                                  : OptimizerPlacement::kDevice);
  std::vector<at::Tensor> params = model->parameters();

  TrainerState state;
  state.data_seed = config.data.seed;
  state.train_seed = config.train.seed;
  const std::string resume_dir = resolve_resume_dir(config.checkpoint);
  if (!resume_dir.empty()) {
    state = load_checkpoint(resume_dir, model, &optimizer);
    model->to(device);
    if (is_rank0) std::cout << "ulysses-train: resumed from " << resume_dir << " at step " << state.step << std::endl;
  }
  const bool checkpoints = !config.checkpoint.dir.empty();
  if (checkpoints && config.checkpoint.save_initial && state.step == 0 && is_rank0) {
    save_checkpoint((std::filesystem::path(config.checkpoint.dir) / "initial").string(), model,
                    config.model, nullptr, state);
  }

  data::DataLoader loader(config.data, config.sequence, config.model.vocab_size, mesh.dp_size(),
                          mesh.dp_rank(), mesh.sp_size(), mesh.sp_rank());
  std::unique_ptr<MetricsWriter> metrics;
  if (is_rank0) metrics = std::make_unique<MetricsWriter>(config.output.dir, config.profile.warmup_steps);
  if (metrics) {
    metrics->set_throughput_basis(mesh.world().size(), config.profile.peak_tflops > 0
                                                           ? config.profile.peak_tflops * 1e12
                                                           : profile::peak_flops_per_rank_from_env());
  }
  const int64_t global_samples =
      mesh.dp_size() * config.sequence.micro_batch * config.sequence.grad_accum;
  const int64_t tokens_per_step = global_samples * loader.padded_length();
  const double step_flops =
      tokens_per_step * profile::training_flops(config.model, loader.padded_length()).per_token();
  const bool evaluating = !config.eval.source.empty();

  auto run_eval = [&](int64_t step) {
    EvalResult result = evaluate(model, config, mesh, device);
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

  for (int64_t step = state.step + 1; step <= config.train.steps; ++step) {
    profile::ScopedRange step_range("step", step);  // nsys capture range: step@ulysses
    memory::reset_peak_device_bytes(device);
    profile::take_phase_times();  // drop anything accumulated between steps
    const auto start = std::chrono::steady_clock::now();
    std::vector<data::Batch> batches = load_step(loader, step, config.sequence.grad_accum, device);
    StepLoss loss = compute_gradients(model, batches, mesh, GradientOptions{config.memory.tiled_loss});
    const double lr = lr_at(config.optim, step, config.train.steps);
    double grad_norm = 0.0;
    {
      profile::ScopedPhase phase("optimizer");
      grad_norm = clip_grad_norm(params, config.optim.grad_clip);
      optimizer.step(lr);
    }
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
    m.peak_mem_bytes = device.is_cuda() ? memory::peak_device_bytes(device) : m.peak_host_bytes;
    m.set_times(profile::take_step_times());
    m.model_flops = step_flops;
    if (is_rank0) {
      metrics->write_step(m);
      print_progress(step, config.train.steps, m);
    }
    const bool last = step == config.train.steps;
    if (checkpoints && is_rank0 &&
        (last || (config.checkpoint.every > 0 && step % config.checkpoint.every == 0))) {
      save_checkpoint(step_dir(config.checkpoint.dir, step), model, config.model, &optimizer, state);
    }
    if (evaluating && (last || (config.eval.every > 0 && step % config.eval.every == 0))) {
      run_eval(step);
    }
    if (checkpoints) mesh.world().barrier();  // nobody races ahead of a checkpoint being written
  }
  if (evaluating && config.train.steps == 0) run_eval(0);  // evaluation-only run
  // The tuner compares peaks against a per-rank limit: the largest rank's peak is what counts.
  at::Tensor peaks = at::tensor({memory::peak_host_bytes(),
                                 device.is_cuda() ? memory::peak_device_bytes(device)
                                                  : memory::peak_host_bytes()},
                                at::kLong)
                         .to(device);  // [2]: host, device
  mesh.world().all_reduce(peaks, comm::ReduceOp::kMax);
  peaks = peaks.cpu();
  if (is_rank0 && metrics) {
    metrics->write_summary({{"max_rank_peak_host_bytes", peaks[0].item<int64_t>()},
                            {"max_rank_peak_mem_bytes", peaks[1].item<int64_t>()},
                            {"world_size", mesh.world().size()},
                            {"dp", mesh.dp_size()},
                            {"sp", mesh.sp_size()},
                            {"sequence_length", loader.padded_length()},
                            {"device", device.str()}});
  }
  return kExitOk;
}

}  // namespace ulysses::train
