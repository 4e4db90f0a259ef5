// Trial status from exit statuses (see classify.h).
#include "tuner/trial/classify.h"

#include <cctype>
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

bool starts_with(const std::string& text, const char* prefix) {
  return text.rfind(prefix, 0) == 0;
}

std::string lowercase(std::string text) {
  for (char& ch : text) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return text;
}

// `segment` without the tqdm bars in it ("desc: NN%|###   | n/N [elapsed<left, rate]"): the text
// after the last bar, "" when nothing follows it.
std::string without_progress_bars(std::string segment) {
  while (true) {
    const size_t percent = segment.find("%|");
    if (percent == std::string::npos || percent == 0 ||
        !std::isdigit(static_cast<unsigned char>(segment[percent - 1]))) {
      return segment;
    }
    const size_t bar_end = segment.find('|', percent + 2);
    if (bar_end == std::string::npos) return segment;
    const size_t stats_end = segment.find(']', bar_end);
    if (stats_end == std::string::npos) return "";
    segment.erase(0, stats_end + 1);
  }
}

// What a terminal would show of one line, progress output removed: the last carriage-return
// segment with something other than progress bars and blanks in it (trailing whitespace
// removed); "" for a blank or progress-only line.
std::string shown_text(const std::string& line) {
  const char* blank = " \t\r\n\f\v";
  size_t end = line.size();
  while (true) {
    const size_t cr = end == 0 ? std::string::npos : line.rfind('\r', end - 1);
    const size_t begin = cr == std::string::npos ? 0 : cr + 1;
    std::string segment = without_progress_bars(line.substr(begin, end - begin));
    const size_t last = segment.find_last_not_of(blank);
    if (last != std::string::npos) return segment.substr(0, last + 1);
    if (cr == std::string::npos) return "";
    end = cr;
  }
}

// torch.distributed's "[rank3]: " prefix removed.
std::string without_rank_prefix(const std::string& line) {
  if (!starts_with(line, "[rank")) return line;
  const size_t close = line.find("]:");
  if (close == std::string::npos) return line;
  const size_t rest = line.find_first_not_of(' ', close + 2);
  return rest == std::string::npos ? std::string() : line.substr(rest);
}

// A traceback's lines other than the exception: Python's header, indented frames and code, the
// chained-exception separators; c10's "frame #N:" and "Exception raised from".
bool is_stack_frame(const std::string& raw) {
  const std::string line = without_rank_prefix(raw);
  return line.empty() || line[0] == ' ' || line[0] == '\t' ||
         starts_with(line, "Traceback (most recent call last)") || starts_with(line, "File \"") ||
         starts_with(line, "frame #") ||
         starts_with(line, "Exception raised from ") ||
         starts_with(line, "During handling of the above exception") ||
         starts_with(line, "The above exception was the direct cause");
}

bool is_warning(const std::string& raw) {
  const std::string line = without_rank_prefix(raw);
  if (starts_with(lowercase(line), "warning")) return true;
  if (line.size() > 2 && line[0] == '[' && line[1] == 'W' &&
      std::isdigit(static_cast<unsigned char>(line[2]))) {
    return true;  // c10's "[W1126 19:24:48.258 file.cpp:12] ..."
  }
  return line.find("Warning:") != std::string::npos ||  // Python's "file.py:3: UserWarning: ..."
         line.find("[WARNING]") != std::string::npos ||
         line.find("warnings.warn(") != std::string::npos;
}

// A line that states an error: our ranks' one-line statuses, an exception's "Type: message" (its
// type a dotted name ending in Error, Exception or Interrupt), a logger's [ERROR].
bool states_error(const std::string& raw) {
  const std::string line = without_rank_prefix(raw);
  const std::string lower = lowercase(line);
  for (const char* prefix : {"error", "fatal", "out of memory:", "communication failed:",
                             "terminate called"}) {
    if (starts_with(lower, prefix)) return true;
  }
  if (line.find("[ERROR]") != std::string::npos) return true;
  size_t name_end = 0;
  while (name_end < line.size() && (std::isalnum(static_cast<unsigned char>(line[name_end])) ||
                                    line[name_end] == '_' || line[name_end] == '.')) {
    ++name_end;
  }
  if (name_end == 0 || (name_end < line.size() && line[name_end] != ':')) return false;
  const std::string name = line.substr(0, name_end);
  for (const std::string suffix : {"Error", "Exception", "Interrupt"}) {
    if (name.size() >= suffix.size() &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      return true;
    }
  }
  return false;
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
  const std::string tail((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return error_line_of(tail);
}

std::string error_line_of(const std::string& text) {
  std::string last_meaningful, last_warning, last_any;
  size_t end = text.size();
  while (true) {  // lines from the last one back
    const size_t newline = end == 0 ? std::string::npos : text.rfind('\n', end - 1);
    const size_t begin = newline == std::string::npos ? 0 : newline + 1;
    const std::string line = shown_text(text.substr(begin, end - begin));
    if (!line.empty()) {
      if (last_any.empty()) last_any = line;
      if (!is_stack_frame(line)) {
        if (states_error(line)) return line;
        std::string& slot = is_warning(line) ? last_warning : last_meaningful;
        if (slot.empty()) slot = line;
      }
    }
    if (newline == std::string::npos) break;
    end = newline;
  }
  if (!last_meaningful.empty()) return last_meaningful;
  return !last_warning.empty() ? last_warning : last_any;
}

}  // namespace ulysses::trial
