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

}  // namespace ulysses::comm
