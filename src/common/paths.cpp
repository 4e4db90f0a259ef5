// Run-time lookup of the project home and of sibling binaries.
#include "common/paths.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>

namespace fs = std::filesystem;

namespace ulysses {

std::string executable_dir() {
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : exe.parent_path().string();
}

std::string project_home() {
  std::error_code ec;
  if (const char* env = std::getenv("ULYSSES_HOME"); env && *env) return env;
  const std::string exe_dir = executable_dir();
  if (!exe_dir.empty()) {
    fs::path above = fs::path(exe_dir).parent_path();
    if (fs::is_directory(above / "profiles", ec)) return above.string();
    // build trees: <root>/build/bin/ulysses-train
    fs::path two_up = above.parent_path();
    if (fs::is_directory(two_up / "profiles", ec)) return two_up.string();
  }
#ifdef ULYSSES_SOURCE_DIR
  if (fs::is_directory(fs::path(ULYSSES_SOURCE_DIR) / "profiles", ec)) return ULYSSES_SOURCE_DIR;
#endif
  return "";
}

std::string sibling_binary(const std::string& name) {
  std::error_code ec;
  if (const char* env = std::getenv("ULYSSES_BIN_DIR"); env && *env) {
    fs::path candidate = fs::path(env) / name;
    if (fs::exists(candidate, ec)) return candidate.string();
  }
  const std::string exe_dir = executable_dir();
  if (!exe_dir.empty()) {
    fs::path candidate = fs::path(exe_dir) / name;
    if (fs::exists(candidate, ec)) return candidate.string();
  }
  return name;
}

bool is_executable_file(const std::string& path) {
  std::error_code ec;
  return fs::is_regular_file(path, ec) && access(path.c_str(), X_OK) == 0;
}

std::string find_on_path(const std::string& name) {
  const char* path_env = std::getenv("PATH");
  const std::string dirs = path_env ? path_env : "";
  for (size_t begin = 0; begin <= dirs.size();) {
    const size_t end = std::min(dirs.find(':', begin), dirs.size());
    if (end > begin) {
      const std::string candidate = (fs::path(dirs.substr(begin, end - begin)) / name).string();
      if (is_executable_file(candidate)) return candidate;
    }
    begin = end + 1;
  }
  return "";
}

}  // namespace ulysses
