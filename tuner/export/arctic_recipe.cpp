// RunConfig -> ArcticTraining recipe YAML; key names are those of arctic-training 0.8's pydantic
// configs (config/trainer.py, model.py, data.py, optimizer.py, scheduler/hf_factory.py).
#include "tuner/export/arctic_recipe.h"

#include <c10/util/Exception.h>
#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <string>

#include "config/yaml_values.h"
#include "tuner/export/deepspeed_config.h"
#include "tuner/export/export_common.h"

namespace ulysses::exports {
namespace {

// The eps of DeepSpeed's FusedAdam and DeepSpeedCPUAdam, which ArcticTraining does not set.
constexpr double kArcticAdamEps = 1.0e-8;

// `text` with its line breaks (LF, and CR, which YAML also ends a line at) replaced by spaces,
// to go into a comment.
std::string one_line(std::string text) {
  for (char& ch : text) {
    if (ch == '\n' || ch == '\r') ch = ' ';
  }
  return text;
}

// A yaml-cpp emitter can only emit; this writes one nlohmann::json value (objects, arrays,
// scalars) as block YAML so that the DeepSpeed part of the recipe is the exporter's own JSON.
void emit_json(YAML::Emitter& out, const nlohmann::json& value) {
  if (value.is_object()) {
    out << YAML::BeginMap;
    for (const auto& [key, item] : value.items()) {
      out << YAML::Key << key << YAML::Value;
      emit_json(out, item);
    }
    out << YAML::EndMap;
  } else if (value.is_array()) {
    out << YAML::Flow << YAML::BeginSeq;
    for (const auto& item : value) emit_json(out, item);
    out << YAML::EndSeq;
  } else if (value.is_boolean()) {
    out << value.get<bool>();
  } else if (value.is_number_integer()) {
    out << value.get<int64_t>();
  } else if (value.is_number_float()) {
    config::emit_value(out, value.get<double>());
  } else if (value.is_string()) {
    out << value.get<std::string>();
  } else {
    TORCH_CHECK(false, "emit_json: unexpected JSON value ", value.dump());
  }
}

// The HF scheduler name and the warmup ratio for optim (see arctic_recipe.h).
struct HfSchedule {
  std::string name;
  double warmup_ratio = 0.0;
  bool with_min_lr = false;  // scheduler_specific_kwargs: {min_lr}
};

HfSchedule hf_schedule(const config::RunConfig& run) {
  const config::OptimOptions& optim = run.optim;
  HfSchedule schedule;
  if (optim.schedule == "constant") {
    schedule.name = optim.warmup_steps == 0 ? "constant" : "constant_with_warmup";
  } else if (optim.schedule == "linear") {
    schedule.name = "linear";
  } else if (optim.schedule == "cosine") {
    schedule.with_min_lr = optim.min_lr > 0.0;
    schedule.name = schedule.with_min_lr ? "cosine_with_min_lr" : "cosine";
  } else {
    TORCH_CHECK(false, "arctic_recipe: optim.schedule must be validated, got ", optim.schedule);
  }
  // ArcticTraining warms up for int(warmup_ratio * train_iters) steps; W / steps can land just
  // below W after the multiplication, (W + 0.5) / steps cannot.
  const int64_t steps = run.train.steps;
  if (optim.warmup_steps >= steps) {
    schedule.warmup_ratio = 1.0;
  } else if (optim.warmup_steps > 0) {
    schedule.warmup_ratio = (static_cast<double>(optim.warmup_steps) + 0.5) / steps;
  }
  return schedule;
}

std::vector<std::string> recipe_warnings(const config::RunConfig& run) {
  refuse_unsupported_mesh(run, "ArcticTraining (DeepSpeed's Ulysses)");
  std::vector<std::string> warnings;
  if (auto warning = ulysses_torch_version_warning(run)) warnings.push_back(*warning);
  for (const std::string& warning : deepspeed_zero_warnings(run)) warnings.push_back(warning);
  if (run.model.load.empty()) {
    warnings.push_back(std::string("model.load: empty, so model.name_or_path is the placeholder ") +
                       kArcticModelPlaceholder + "; set it to an HF model of family " +
                       model_family_text(run) + ": a hub name or a local dir");
  }
  warnings.push_back("data.source: '" + run.data.source +
                     "' has no ArcticTraining data source; replace data.sources' placeholder " +
                     kArcticDataPlaceholder + " with an HF dataset that has a text column");
  const config::TileCount& mlp = run.memory.tiled_mlp;
  if (!mlp.is_auto() && mlp.value > 1) {
    warnings.push_back("memory.tiled_mlp=" + std::to_string(mlp.value) +
                       ": ArcticTraining tiles the MLP with its automatic count, ceil(seqlen /"
                       " hidden_size) max-reduced over ranks; a fixed count is not expressible");
  }
  const config::TileCount& loss = run.memory.tiled_loss;
  if (loss.value != 1) {
    const std::string tiles = loss.is_auto() ? "auto" : std::to_string(loss.value);
    if (run.mesh.sp == 1) {
      warnings.push_back("memory.tiled_loss=" + tiles +
                         ": ArcticTraining tiles logits+loss only when sequence_parallel_size > 1;"
                         " with 1 the full logits are materialized");
    } else if (!loss.is_auto()) {
      warnings.push_back("memory.tiled_loss=" + tiles +
                         ": ArcticTraining picks its own logits+loss tile count (about 1 GiB of"
                         " fp32 logits per tile); a fixed count is not expressible");
    }
  }
  if (run.optim.eps != kArcticAdamEps) {
    warnings.push_back("optim.eps: " + config::format_double(run.optim.eps) +
                       " is not expressible; ArcticTraining's Adam factories use eps 1e-8");
  }
  if (run.optim.weight_decay > 0.0) {
    warnings.push_back(
        "optim.weight_decay: ArcticTraining exempts norm weights and biases from weight decay;"
        " ulysses-train decays every parameter");
  }
  if (run.optim.schedule == "linear" && run.optim.min_lr > 0.0) {
    warnings.push_back("optim.min_lr: HF's linear schedule decays to 0, not to min_lr " +
                       config::format_double(run.optim.min_lr));
  }
  if (run.optim.warmup_steps > run.train.steps) {
    warnings.push_back("optim.warmup_steps: " + std::to_string(run.optim.warmup_steps) +
                       " > train.steps " + std::to_string(run.train.steps) +
                       "; ArcticTraining's warmup_ratio is capped at 1 (warmup of train.steps)");
  }
  return warnings;
}

}  // namespace

ArcticRecipeExport arctic_recipe(const config::RunConfig& run) {
  const MeshSizes mesh = mesh_sizes(run);
  const config::MemoryOptions& memory = run.memory;
  const config::OptimOptions& optim = run.optim;
  const nlohmann::json deepspeed = deepspeed_config(run).config;
  const HfSchedule schedule = hf_schedule(run);

  YAML::Emitter out;
  out << YAML::Comment(
      "ArcticTraining recipe exported by ulysses-tune from a ulysses-train run config.\n"
      "Model family: " + model_family_text(run) + ".\n"
      "Replace the REPLACE_WITH_* placeholders, then run: arctic_training THIS_FILE.yaml");
  out << YAML::BeginMap;
  out << YAML::Key << "type" << YAML::Value << "causal";
  out << YAML::Key << "micro_batch_size" << YAML::Value << run.sequence.micro_batch;
  out << YAML::Key << "gradient_accumulation_steps" << YAML::Value << run.sequence.grad_accum;
  out << YAML::Key << "sequence_parallel_size" << YAML::Value << mesh.sp;
  out << YAML::Key << "tiled_mlp_compute" << YAML::Value << (memory.tiled_mlp.value != 1);
  out << YAML::Key << "activation_checkpoint_cpu_offload" << YAML::Value
      << memory.offload_activations;
  out << YAML::Key << "train_iters" << YAML::Value << run.train.steps;
  out << YAML::Key << "seed" << YAML::Value << run.train.seed;

  out << YAML::Key << "model" << YAML::Value << YAML::BeginMap;
  if (run.model.load.empty()) {
    out << YAML::Key << "name_or_path" << YAML::Value << kArcticModelPlaceholder
        << YAML::Comment("replace: an HF hub name or a local model dir (config.json, tokenizer) "
                         "of family " + model_family_text(run));
  } else {
    out << YAML::Key << "name_or_path" << YAML::Value << run.model.load
        << YAML::Comment("model.load, of family " + run.model.family +
                         "; the tokenizer is read from here too");
  }
  // The weights' dtype: bf16-states is bf16 weights (what the optimizer keeps is DeepSpeed's).
  out << YAML::Key << "dtype" << YAML::Value
      << (memory.precision == "bf16-states" ? std::string("bf16") : memory.precision);
  out << YAML::Key << "attn_implementation" << YAML::Value << hf_attention_implementation(run);
  out << YAML::Key << "disable_activation_checkpoint" << YAML::Value
      << !(memory.checkpointing || memory.offload_activations);
  out << YAML::EndMap;

  out << YAML::Key << "data" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "sources" << YAML::Value << YAML::BeginSeq << kArcticDataPlaceholder
      << YAML::Comment("replace: an HF dataset with a text column (data.source " +
                       one_line(run.data.source) + ")")
      << YAML::EndSeq;
  out << YAML::Key << "max_length" << YAML::Value << run.sequence.length;
  out << YAML::Key << "seed" << YAML::Value << run.data.seed;
  out << YAML::EndMap;

  out << YAML::Key << "optimizer" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "type" << YAML::Value
      << (deepspeed_offloads_optimizer(run) ? "cpu_adam" : "fused_adam");
  out << YAML::Key << "learning_rate" << YAML::Value;
  config::emit_value(out, optim.lr);
  out << YAML::Key << "betas" << YAML::Value;
  config::emit_value(out, optim.betas);
  out << YAML::Key << "weight_decay" << YAML::Value;
  config::emit_value(out, optim.weight_decay);
  out << YAML::EndMap;

  out << YAML::Key << "scheduler" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "name" << YAML::Value << schedule.name;
  out << YAML::Key << "warmup_ratio" << YAML::Value;
  config::emit_value(out, schedule.warmup_ratio);
  out << YAML::Comment("int(warmup_ratio * train_iters) = optim.warmup_steps " +
                       std::to_string(optim.warmup_steps));
  if (schedule.with_min_lr) {
    out << YAML::Key << "scheduler_specific_kwargs" << YAML::Value << YAML::BeginMap;
    out << YAML::Key << "min_lr" << YAML::Value;
    config::emit_value(out, optim.min_lr);
    out << YAML::EndMap;
  }
  out << YAML::EndMap;

  out << YAML::Key << "deepspeed" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "zero_optimization" << YAML::Value;
  emit_json(out, deepspeed.at("zero_optimization"));
  out << YAML::Key << "gradient_clipping" << YAML::Value;
  config::emit_value(out, optim.grad_clip);
  for (const char* key : {"data_types", "communication_data_type"}) {  // bf16: fp32 gradients
    if (!deepspeed.contains(key)) continue;
    out << YAML::Key << key << YAML::Value;
    emit_json(out, deepspeed.at(key));
  }
  out << YAML::Key << "seq_parallel_communication_data_type" << YAML::Value
      << deepspeed.at("seq_parallel_communication_data_type").get<std::string>();
  out << YAML::EndMap;
  out << YAML::EndMap;
  TORCH_CHECK(out.good(), "arctic_recipe: YAML emitter error: ", out.GetLastError());

  return ArcticRecipeExport{std::string(out.c_str()) + "\n", recipe_warnings(run)};
}

}  // namespace ulysses::exports
