// Communication failures: a peer rank died, or a collective or the rendezvous did not complete in
// time. Distinct from ulysses::UserError (bad input) so that mains can exit kExitCommFailure.
#pragma once
#include <stdexcept>
#include <string>

namespace ulysses::comm {

// A collective or the rendezvous failed at run time (peer died, connection lost, timeout).
// what() is one line, e.g. "collective all_to_all on group sp timed out after 30 s (a peer rank
// probably died or stopped calling collectives) [gloo: Timed out waiting 30000ms for recv ...]".
// Mains print "error: " + what() and exit ulysses::kExitCommFailure.
class CommError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The one-line message of a failed collective `op` (e.g. "all_reduce") on group `group` (e.g.
// "sp"), given the backend's own text `detail` (may be multi-line; only its first line is kept,
// shortened to ~300 characters). Classifies the failure from `detail`: a timeout (mentions "timed
// out"/"timeout"), a lost peer ("closed by peer", "connection reset", "broken pipe", ...), or
// anything else ("failed"). Pure; used by Group and testable on its own.
std::string describe_comm_failure(const std::string& op, const std::string& group, double timeout_s,
                                  const std::string& detail);

// The text of an exception for a message: c10::Error without its C++ backtrace, else what().
std::string exception_text(const std::exception& e);

}  // namespace ulysses::comm
