// Watching processes in tests: whether one is alive, and waiting for a condition with a deadline.
#pragma once
#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>
#include <thread>

#include "support/test_files.h"

namespace ulysses::testing {

// Alive and not a zombie (a killed process reparented to a non-reaping init stays a zombie).
inline bool process_alive(pid_t pid) {
  if (kill(pid, 0) != 0) return false;
  const std::string stat = read_text("/proc/" + std::to_string(pid) + "/stat");
  const size_t paren = stat.rfind(')');
  return paren == std::string::npos || paren + 2 >= stat.size() || stat[paren + 2] != 'Z';
}

// Polls done() every 20 ms; false when deadline_s passed first.
inline bool wait_until(const std::function<bool()>& done, double deadline_s) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(deadline_s);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

}  // namespace ulysses::testing
