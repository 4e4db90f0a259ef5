// Trial status from exit statuses (see classify.h).
#include "tuner/trial/classify.h"

#include <fstream>
#include <sstream>

#include "common/error.h"

namespace ulysses::trial {
namespace {

// Seconds as a short number: 1, 2.5, 0.25.
std::string format_seconds(double seconds) {
  std::ostringstream text;
  text << seconds;
  return text.str();
}

std::string line_of(const std::vector<std::string>& lines, int rank) {
  return rank >= 0 && static_cast<size_t>(rank) < lines.size() ? lines[rank] : std::string();
}

// A death from a signal the supervisor did not send, or an out-of-memory exit: a rank's own
// failure, never a consequence of a peer's.
bool is_own_failure(const launch::ProcessExit& exit) {
  return exit.status == kExitOutOfMemory || (exit.signal != 0 && !exit.signalled_by_us);
}

// The exit that caused the failure: the first failing one, unless it is a comm failure and
// another rank failed on its own.
launch::ProcessExit root_cause(const launch::SupervisionResult& result) {
  const launch::ProcessExit& first = *result.first_failure;
  if (first.status != kExitCommFailure || first.signal != 0) return first;
  for (const auto& exit : result.exits) {
    if (exit.index != first.index && exit.pid > 0 && is_own_failure(exit)) return exit;
  }
  return first;
}

}  // namespace

Classification classify(const launch::SupervisionResult& result, bool summary_readable,
                        const std::vector<std::string>& last_stderr_lines, double timeout_s) {
  Classification c;
  switch (result.outcome) {
    case launch::Outcome::kAllSucceeded:
      c.status = summary_readable ? "ok" : "failed";
      c.exit_code = 0;
      if (!summary_readable) c.error = "rank 0 wrote no summary.json";
      return c;
    case launch::Outcome::kInterrupted:
      c.status = "running";
      c.error = "interrupted by signal " + std::to_string(result.interrupt_signal);
      return c;
    case launch::Outcome::kTimedOut:
      c.status = "timeout";
      c.exit_code = launch::kExitTimedOut;
      c.error = "timed out after " + format_seconds(timeout_s) + " s";
      for (const auto& line : last_stderr_lines) {
        if (line.empty()) continue;
        c.error += "; " + line;
        break;
      }
      return c;
    case launch::Outcome::kFailed:
      break;
  }
  const launch::ProcessExit cause = root_cause(result);
  c.rank = cause.index;
  c.exit_code = cause.status;
  if (cause.signal != 0) {
    c.status = "killed";
  } else if (cause.status == kExitOutOfMemory) {
    c.status = "oom";
  } else if (cause.status == launch::kExitTimedOut) {
    c.status = "timeout";
  } else {
    c.status = "failed";
  }
  c.error = line_of(last_stderr_lines, cause.index);
  if (c.error.empty()) {
    c.error = "rank " + std::to_string(cause.index) + " " + launch::describe_exit(cause);
  }
  return c;
}

std::string last_nonempty_line(const std::string& path) {
  constexpr std::streamoff kTailBytes = 64 * 1024;
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return "";
  const std::streamoff size = in.tellg();
  in.seekg(size > kTailBytes ? size - kTailBytes : 0);
  std::string tail((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const char* blank = " \t\r\n";
  const size_t end = tail.find_last_not_of(blank);
  if (end == std::string::npos) return "";
  const size_t newline = tail.rfind('\n', end);
  const size_t begin = newline == std::string::npos ? 0 : newline + 1;
  return tail.substr(begin, end + 1 - begin);
}

}  // namespace ulysses::trial
