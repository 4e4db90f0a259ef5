// Classification and formatting of communication failures (see errors.h).
#include "comm/errors.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cctype>
#include <sstream>

namespace ulysses::comm {
namespace {

constexpr size_t kMaxDetailChars = 300;

std::string lowercase(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

// First non-empty line of `text`, trimmed and shortened.
std::string first_line(const std::string& text) {
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    const auto begin = line.find_first_not_of(" \t\r");
    if (begin == std::string::npos) continue;
    line = line.substr(begin);
    line.erase(line.find_last_not_of(" \t\r") + 1);
    if (line.size() > kMaxDetailChars) line = line.substr(0, kMaxDetailChars) + "...";
    return line;
  }
  return "no detail";
}

bool mentions_any(const std::string& lower_text, std::initializer_list<const char*> needles) {
  for (const char* needle : needles) {
    if (lower_text.find(needle) != std::string::npos) return true;
  }
  return false;
}

std::string format_seconds(double seconds) {
  std::ostringstream out;
  out << seconds;
  return out.str();
}

}  // namespace

std::string describe_comm_failure(const std::string& op, const std::string& group, double timeout_s,
                                  const std::string& detail) {
  const std::string lower = lowercase(detail);
  std::string what = "collective " + op + " on group " + group;
  if (mentions_any(lower, {"timed out", "timeout", "time out"})) {
    what += " timed out after " + format_seconds(timeout_s) +
            " s (comm.collective_timeout_s; a peer rank probably died or stopped calling "
            "collectives)";
  } else if (mentions_any(lower, {"closed by peer", "connection reset", "connection refused",
                                  "broken pipe", "connection closed", "socket closed",
                                  "remote process exited", "nccl communicator was aborted"})) {
    what += " lost its connection to a peer (a peer rank probably died)";
  } else {
    what += " failed";
  }
  return what + " [" + first_line(detail) + "]";
}

std::string exception_text(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) {
    return c10_error->what_without_backtrace();
  }
  return e.what();
}

}  // namespace ulysses::comm
