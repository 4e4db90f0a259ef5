// The two kinds of errors: bad user input is a UserError with one line naming the field
// or file; bugs trip TORCH_CHECK / TORCH_INTERNAL_ASSERT with file:line. Exit codes are shared by
// every binary so that the launcher and the tuner can tell failures apart.
#pragma once
#include <stdexcept>
#include <string>

namespace ulysses {

// Bad input or an infeasible configuration. what() is one line, "<field or file>: <what is
// wrong>", with no trailing newline. Mains print "error: " + what() to stderr and exit kExitUsage.
class UserError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Process exit statuses of ulysses-train, ulysses-tune and ulysses-bench.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;      // a bug or an unexpected runtime error
inline constexpr int kExitUsage = 2;        // bad input: UserError
inline constexpr int kExitOutOfMemory = 12;  // "out of memory: ..." (host or device)
inline constexpr int kExitCommFailure = 13;  // a peer died or a collective timed out
inline constexpr int kExitInterrupted = 130;  // SIGINT / SIGTERM

// True when an exception's text says an allocation failed: CUDA "out of memory"
// (c10::OutOfMemoryError), the CPU allocator's "can't allocate memory" under memory.limit_gib, or
// std::bad_alloc. Every place that converts errors keeps these out of memory (exit 12).
inline bool is_out_of_memory_text(const std::string& what) {
  return what.find("out of memory") != std::string::npos ||
         what.find("can't allocate memory") != std::string::npos ||
         what.find("std::bad_alloc") != std::string::npos;
}

}  // namespace ulysses
