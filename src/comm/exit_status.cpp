// Error -> exit status mapping for every binary's main (see exit_status.h).
#include "comm/exit_status.h"

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <new>
#include <string>

#include "comm/errors.h"
#include "common/error.h"

namespace ulysses::comm {
namespace {

// The first line of an error's text, without an "error: " it may already start with (so the
// printed line never reads "error: error: ...").
std::string first_line(const std::string& text) {
  std::string line = text.substr(0, text.find('\n'));
  while (line.rfind("error: ", 0) == 0) line.erase(0, 7);
  return line;
}

}  // namespace

int report_current_exception() {
  try {
    throw;
  } catch (const UserError& e) {
    std::cerr << "error: " << first_line(e.what()) << std::endl;
    return kExitUsage;
  } catch (const CommError& e) {
    std::cerr << "error: " << first_line(e.what()) << std::endl;
    return kExitCommFailure;
  } catch (const std::bad_alloc&) {
    std::cerr << "out of memory: host allocation failed" << std::endl;
    return kExitOutOfMemory;
  } catch (const std::exception& e) {
    if (is_out_of_memory_text(e.what())) {
      std::cerr << "out of memory: " << first_line(e.what()) << std::endl;
      return kExitOutOfMemory;
    }
    std::cerr << "error: " << first_line(e.what()) << std::endl;
    return kExitFailure;
  } catch (...) {
    std::cerr << "error: unknown exception" << std::endl;
    return kExitFailure;
  }
}

int run_with_exit_status(const std::function<int()>& body) {
  try {
    return body();
  } catch (...) {
    return report_current_exception();
  }
}

int run_rank_or_exit(const std::function<int()>& body) {
  try {
    return body();
  } catch (...) {
    const int status = report_current_exception();
    std::cout.flush();
    std::cerr.flush();
    std::fflush(nullptr);
    std::_Exit(status);
  }
}

}  // namespace ulysses::comm
