// RunConfig -> Accelerate config YAML; key names are accelerate 1.15's (ClusterConfig fields and
// the `parallelism_config_*` launcher arguments). See accelerate_config.h.
#include "tuner/export/accelerate_config.h"

#include <c10/util/Exception.h>
#include <yaml-cpp/yaml.h>

#include "tuner/export/export_common.h"

namespace ulysses::exports {

AccelerateExport accelerate_config(const config::RunConfig& run,
                                   const std::string& deepspeed_config_file, int64_t nodes) {
  TORCH_CHECK(!deepspeed_config_file.empty(), "accelerate_config: empty deepspeed_config_file");
  const MeshSizes mesh = mesh_sizes(run);
  TORCH_CHECK(nodes >= 1 && mesh.world % nodes == 0, "accelerate_config: ", nodes,
              " nodes do not divide the world of ", mesh.world);
  AccelerateExport exported;
  refuse_unsupported_mesh(run, "Accelerate (over DeepSpeed's Ulysses)");
  if (auto warning = ulysses_torch_version_warning(run)) exported.warnings.push_back(*warning);
  if (auto warning = alst_switches_warning(run, "An Accelerate config")) {
    exported.warnings.push_back(*warning);
  }
  for (const std::string& warning : deepspeed_zero_warnings(run)) {
    exported.warnings.push_back(warning);
  }
  if (nodes > 1) {
    exported.warnings.push_back(
        "nodes=" + std::to_string(nodes) + ": accelerate_config.yaml says machine_rank 0; on " +
        "each node set its own machine_rank (0 to " + std::to_string(nodes - 1) +
        ") and main_process_ip / main_process_port to the first node's address (accelerate " +
        "launch --machine_rank R --main_process_ip ADDR --main_process_port PORT)");
  }

  YAML::Emitter out;
  out << YAML::Comment(
      "Accelerate config exported by ulysses-tune from a ulysses-train run config.\n"
      "Model family: " + model_family_text(run) + "; train.py loads the model (no key here).\n"
      "Launch: accelerate launch --config_file THIS_FILE.yaml train.py\n"
      "No mixed_precision key: Accelerate rejects it beside deepspeed_config_file; precision is\n"
      "the bf16 block of the DeepSpeed config file.");
  out << YAML::BeginMap;
  out << YAML::Key << "compute_environment" << YAML::Value << "LOCAL_MACHINE";
  out << YAML::Key << "debug" << YAML::Value << false;
  out << YAML::Key << "distributed_type" << YAML::Value << "DEEPSPEED";
  out << YAML::Key << "deepspeed_config" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "deepspeed_config_file" << YAML::Value << deepspeed_config_file;
  out << YAML::EndMap;
  out << YAML::Key << "machine_rank" << YAML::Value << 0;
  if (nodes > 1) out << YAML::Comment("this node's rank: 0 to " + std::to_string(nodes - 1));
  out << YAML::Key << "num_machines" << YAML::Value << nodes;
  out << YAML::Key << "num_processes" << YAML::Value << mesh.world
      << YAML::Comment("world = dp * sp, over all machines");
  out << YAML::Key << "use_cpu" << YAML::Value << false;
  out << YAML::Key << "parallelism_config" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "parallelism_config_dp_replicate_size" << YAML::Value << 1;
  out << YAML::Key << "parallelism_config_dp_shard_size" << YAML::Value << mesh.dp
      << YAML::Comment("dp_replicate * dp_shard * sp = num_processes");
  out << YAML::Key << "parallelism_config_sp_size" << YAML::Value << mesh.sp;
  out << YAML::Key << "parallelism_config_sp_backend" << YAML::Value << "deepspeed";
  out << YAML::Key << "parallelism_config_sp_seq_length_is_variable" << YAML::Value << true;
  out << YAML::Key << "parallelism_config_sp_attn_implementation" << YAML::Value
      << hf_attention_implementation(run);
  out << YAML::EndMap;
  out << YAML::EndMap;
  TORCH_CHECK(out.good(), "accelerate_config: YAML emitter error: ", out.GetLastError());
  exported.yaml = std::string(out.c_str()) + "\n";
  return exported;
}

}  // namespace ulysses::exports
