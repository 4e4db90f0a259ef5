// The one mapping from errors to process exit statuses, shared by ulysses-train, ulysses-tune and
// ulysses-bench (common/error.h lists the statuses).
#pragma once
#include <functional>

namespace ulysses::comm {

// Runs `body` and returns its status. An escaping exception is printed to stderr as ONE line and
// mapped: UserError -> "error: ..." kExitUsage; CommError -> "error: ..." kExitCommFailure;
// std::bad_alloc or an allocator "out of memory" error -> "out of memory: ..." kExitOutOfMemory;
// anything else -> "error: ..." kExitFailure (c10 backtraces are cut to their first line).
int run_with_exit_status(const std::function<int()>& body);

// Prints the current exception's one line to stderr as run_with_exit_status does and returns its
// status. REQUIRES: called inside a catch block (std::current_exception() non-null).
int report_current_exception();

// Runs `body` (a rank's work once its process groups exist) and returns its status. When it
// throws, the one line is printed and the process ends at once with that status (std::_Exit,
// after flushing stdout/stderr), without unwinding further: tearing down process groups whose
// peers are blocked in a collective can wait for them up to the collective timeout, so a rank
// that ran out of memory would otherwise exit late, after its peers have already failed with
// "lost its connection". Exiting first is what makes the peers' failure a consequence of this
// rank's, so the launcher sees this rank's own status (12 for out of memory). Files written
// line by line and flushed (metrics.jsonl) are complete; nothing half-written is renamed into
// place (checkpoints are written to a temporary name first).
int run_rank_or_exit(const std::function<int()>& body);

}  // namespace ulysses::comm
