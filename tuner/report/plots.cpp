// Writing plot files and running gnuplot on them (see plots.h).
#include "tuner/report/plots.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "common/error.h"
#include "common/paths.h"

namespace fs = std::filesystem;

namespace ulysses::report {
namespace {

// Runs `gnuplot script` with `dir` as working directory, stdout and stderr into `log`;
// returns the exit status (128 + signal when killed, 127 when it could not be started).
int run_in(const std::string& gnuplot, const std::string& script, const fs::path& dir,
           const fs::path& log) {
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("gnuplot: cannot start a process");
  if (pid == 0) {
    const int null_fd = open("/dev/null", O_RDONLY);
    const int log_fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (null_fd < 0 || log_fd < 0 || chdir(dir.c_str()) != 0) _exit(127);
    dup2(null_fd, STDIN_FILENO);
    dup2(log_fd, STDOUT_FILENO);
    dup2(log_fd, STDERR_FILENO);
    execl(gnuplot.c_str(), gnuplot.c_str(), script.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) throw std::runtime_error("gnuplot: lost its process");
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string last_line(const fs::path& file) {
  std::ifstream in(file);
  std::string line, last;
  while (std::getline(in, line)) {
    if (line.find_first_not_of(" \t\r^") != std::string::npos) last = line;
  }
  return last.empty() ? "no message" : last;
}

}  // namespace

std::optional<std::string> find_gnuplot(const std::string& requested) {
  if (!requested.empty()) {
    if (!is_executable_file(requested)) {
      throw UserError("--gnuplot " + requested + ": not an executable file");
    }
    return requested;
  }
  if (const char* env = std::getenv("GNUPLOT"); env != nullptr && *env != '\0') {
    return is_executable_file(env) ? std::optional<std::string>(env) : std::nullopt;
  }
  const std::string found = find_on_path("gnuplot");
  return found.empty() ? std::nullopt : std::optional<std::string>(found);
}

std::vector<Plot> write_plots(const SweepData& data, const std::string& dir,
                              const std::optional<std::string>& gnuplot) {
  PlotFiles files = make_plot_files(data);
  for (const auto& [name, content] : files.files) {
    const fs::path path = fs::path(dir) / name;
    std::ofstream out(path, std::ios::binary);
    out << content;
    if (!out.flush()) throw UserError(path.string() + ": cannot write");
  }
  const bool any = std::any_of(files.plots.begin(), files.plots.end(),
                               [](const Plot& p) { return p.omitted.empty(); });
  if (!any) return files.plots;
  if (!gnuplot) {
    for (Plot& plot : files.plots) {
      if (plot.omitted.empty()) {
        plot.omitted =
            "Not drawn: gnuplot was not found (install it, e.g. Debian's gnuplot-nox, then run "
            "`gnuplot plots.gp` in this directory).";
      }
    }
    return files.plots;
  }
  const fs::path log = fs::path(dir) / "gnuplot.log";
  const int status = run_in(*gnuplot, "plots.gp", fs::absolute(dir), fs::absolute(log));
  if (status != 0) {
    throw std::runtime_error("gnuplot: " + *gnuplot + " exited with status " +
                             std::to_string(status) + ": " + last_line(log));
  }
  for (const Plot& plot : files.plots) {
    if (plot.omitted.empty() && !fs::is_regular_file(fs::path(dir) / plot.file)) {
      throw std::runtime_error("gnuplot: " + plot.file + " was not drawn: " + last_line(log));
    }
  }
  std::error_code ec;
  fs::remove(log, ec);
  return files.plots;
}

}  // namespace ulysses::report
