// The three export files of a run config, written atomically side by side; see export_files.h.
#include "tuner/export/export_files.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "common/error.h"
#include "tuner/export/accelerate_config.h"
#include "tuner/export/arctic_recipe.h"
#include "tuner/export/deepspeed_config.h"
#include "tuner/export/export_common.h"

namespace ulysses::exports {
namespace {

namespace fs = std::filesystem;

// Writes `text` to `path` through a temporary file in the same directory and a rename.
void write_atomically(const fs::path& path, const std::string& text) {
  // Appended piecewise: GCC 12 warns (-Wrestrict, a false positive) on "." + std::string&&.
  std::string tmp_name = ".";
  tmp_name += path.filename().string();
  tmp_name += ".tmp-" + std::to_string(getpid());
  const fs::path tmp_path = path.parent_path() / tmp_name;
  {
    std::ofstream file(tmp_path, std::ios::binary | std::ios::trunc);
    file << text;
    file.close();
    if (!file) {
      std::error_code ignored;
      fs::remove(tmp_path, ignored);
      throw UserError(path.string() + ": cannot write (" + tmp_path.string() + " failed)");
    }
  }
  std::error_code ec;
  fs::rename(tmp_path, path, ec);
  if (ec) {
    std::error_code ignored;
    fs::remove(tmp_path, ignored);
    throw UserError(path.string() + ": cannot write (" + ec.message() + ")");
  }
}

void append_new(std::vector<std::string>& all, const std::vector<std::string>& more) {
  for (const std::string& line : more) {
    if (std::find(all.begin(), all.end(), line) == all.end()) all.push_back(line);
  }
}

}  // namespace

ExportFiles write_exports(const config::RunConfig& run, const std::string& dir, int64_t nodes) {
  if (auto line = unsupported_mesh(run, "DeepSpeed (and ArcticTraining and Accelerate over it)")) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) throw UserError(dir + ": cannot write (" + ec.message() + ")");
    ExportFiles files;
    files.warnings.push_back(*line);
    return files;
  }
  const DeepSpeedExport deepspeed = deepspeed_config(run);
  const ArcticRecipeExport arctic = arctic_recipe(run);
  const AccelerateExport accelerate = accelerate_config(run, kDeepSpeedConfigFile, nodes);

  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw UserError(dir + ": cannot write (" + ec.message() + ")");

  ExportFiles files;
  files.deepspeed_path = (fs::path(dir) / kDeepSpeedConfigFile).string();
  files.arctic_path = (fs::path(dir) / kArcticRecipeFile).string();
  files.accelerate_path = (fs::path(dir) / kAccelerateConfigFile).string();
  write_atomically(files.deepspeed_path, deepspeed.config.dump(2) + "\n");
  write_atomically(files.arctic_path, arctic.yaml);
  write_atomically(files.accelerate_path, accelerate.yaml);

  append_new(files.warnings, deepspeed.warnings);
  append_new(files.warnings, arctic.warnings);
  append_new(files.warnings, accelerate.warnings);
  return files;
}

}  // namespace ulysses::exports
