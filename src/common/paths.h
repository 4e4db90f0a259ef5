// Where the project's data (profiles/, experiments/) and sibling binaries are found at run time.
#pragma once
#include <string>

namespace ulysses {

// The project root holding profiles/: $ULYSSES_HOME if set, else the directory above the running
// executable's bin/ if it holds profiles/, else the source tree the binary was built from.
// Returns an empty string when none holds profiles/.
std::string project_home();

// The absolute path of a binary that sits beside the running executable (e.g. "ulysses-train"),
// or $ULYSSES_BIN_DIR/<name> when that variable is set. Returns <name> unchanged (PATH lookup)
// when neither exists.
std::string sibling_binary(const std::string& name);

// Directory of the running executable (from /proc/self/exe).
std::string executable_dir();

// True when `path` is a regular file this process may execute.
bool is_executable_file(const std::string& path);

// The first <dir>/<name> on $PATH that is an executable file, or "" when there is none.
std::string find_on_path(const std::string& name);

}  // namespace ulysses
