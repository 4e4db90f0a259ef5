// A deepspeed trial's files and command (see deepspeed_trial.h).
#include "tuner/backends/deepspeed/deepspeed_trial.h"

#include <filesystem>
#include <fstream>
#include <memory>

#include "common/error.h"
#include "common/paths.h"
#include "config/run_config.h"
#include "data/dataset_writer.h"
#include "data/loss_mask.h"
#include "data/source_spec.h"
#include "data/token_source.h"
#include "tuner/export/deepspeed_config.h"
#include "tuner/export/export_common.h"

namespace ulysses::backends {
namespace {

namespace fs = std::filesystem;

// run_dir is the sweep's own trial directory (the runner writes run.yaml there the same way).
void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  if (!out.flush()) throw UserError("run_dir: cannot write " + path);
}

}  // namespace

std::string deepspeed_trial_script() {
  const std::string home = project_home();
  return (fs::path(home.empty() ? "." : home) / "tuner" / "backends" / "deepspeed" / "ds_trial.py")
      .string();
}

std::optional<std::string> deepspeed_refusal(const config::RunConfig& run) {
  if (auto line = exports::unsupported_mesh(run, "DeepSpeed")) return line;
  if (run.data.pack) {
    return std::string("data.pack: the deepspeed backend trains unpacked samples; set data.pack: "
                       "false");
  }
  if (run.memory.precision == "bf16-states") {
    return std::string("memory.precision: bf16-states: DeepSpeed's bf16 keeps fp32 master weights "
                       "and AdamW moments, so the deepspeed backend cannot run these numerics; "
                       "set memory.precision: bf16");
  }
  if (run.data.packing == "documents") {
    return std::string("data.packing: documents: the deepspeed backend trains windows of the "
                       "token stream; set data.packing: windows");
  }
  if (const data::SourceSpec spec = data::parse_source(run.data.source, "data.source");
      spec.kind == data::SourceKind::kMegatron &&
      !data::find_loss_mask(spec.path, run.data.loss_mask, "data.loss_mask").empty()) {
    return std::string("data.loss_mask: the deepspeed backend learns every token (its samples "
                       "carry no mask); set data.loss_mask: ignore");
  }
  if (!run.model.preset.empty()) {
    return "model.preset: " + run.model.preset +
           ": the deepspeed backend builds the model from model.load or the inline model.* "
           "shapes";
  }
  const std::string& attention = run.attention.backend;
  if (attention != "auto" && attention != "math") {
    return "attention.backend: " + attention +
           ": the deepspeed backend runs transformers' sdpa (attention.backend auto or math)";
  }
  return std::nullopt;
}

DeepSpeedTrial prepare_deepspeed_trial(const config::RunConfig& run, const std::string& run_dir,
                                       const std::string& python) {
  if (auto line = deepspeed_refusal(run)) throw UserError(*line);
  std::error_code ec;
  fs::create_directories(run_dir, ec);
  if (ec) throw UserError(run_dir + ": cannot create: " + ec.message());

  const exports::DeepSpeedExport ds = exports::deepspeed_config(run);
  const std::string ds_path = (fs::path(run_dir) / "ds_config.json").string();
  write_text(ds_path, ds.config.dump(2) + "\n");

  // Every sample the run reads, in order: step s trains samples [(s-1)G, sG).
  const int64_t length = run.sequence.length;
  const int64_t samples =
      run.train.steps * run.mesh.dp * run.sequence.micro_batch * run.sequence.grad_accum;
  const std::unique_ptr<data::TokenSource> source =
      data::open_token_source(run.data, length, run.model.vocab_size);
  std::vector<int64_t> tokens;
  tokens.reserve(static_cast<size_t>(samples * length));
  for (int64_t i = 0; i < samples; ++i) {
    const std::vector<int64_t> sample = source->tokens(i);
    tokens.insert(tokens.end(), sample.begin(), sample.end());
  }
  const bool wide = run.model.vocab_size > 65536;
  const std::string tokens_path = (fs::path(run_dir) / "tokens.bin").string();
  data::write_token_file(tokens_path, tokens,
                         wide ? data::TokenDType::kUInt32 : data::TokenDType::kUInt16);

  config::RunConfig local = run;
  local.data.source = "tokens:" + fs::absolute(tokens_path).string();
  local.data.token_dtype = wide ? "uint32" : "uint16";

  DeepSpeedTrial trial;
  trial.program = python;
  trial.arguments = {deepspeed_trial_script(), "--config",
                     (fs::path(run_dir) / "run.yaml").string(), "--ds-config", ds_path};
  trial.config_yaml = config::to_yaml(local);
  trial.warnings = ds.warnings;
  return trial;
}

}  // namespace ulysses::backends
