// Process-wide nesting of contribution windows (see contribution_window.h).
#include "sp/contribution_window.h"

#include <c10/util/Exception.h>

#include <exception>
#include <mutex>
#include <utility>
#include <vector>

namespace ulysses::sp {
namespace {

struct WindowState {
  std::mutex mutex;
  int depth = 0;
  unsigned long long generation = 0;
  std::vector<std::function<void()>> on_close;
};

WindowState& state() {
  static WindowState s;
  return s;
}

}  // namespace

ContributionWindow::ContributionWindow() : uncaught_at_open_(std::uncaught_exceptions()) {
  std::lock_guard<std::mutex> lock(state().mutex);
  if (state().depth++ == 0) ++state().generation;
}

ContributionWindow::~ContributionWindow() noexcept(false) {
  std::vector<std::function<void()>> callbacks;
  {
    std::lock_guard<std::mutex> lock(state().mutex);
    if (--state().depth > 0) return;
    callbacks.swap(state().on_close);
  }
  if (std::uncaught_exceptions() > uncaught_at_open_) return;  // unwinding: dropped
  for (auto& callback : callbacks) callback();
}

bool ContributionWindow::is_open() {
  std::lock_guard<std::mutex> lock(state().mutex);
  return state().depth > 0;
}

unsigned long long ContributionWindow::generation() {
  std::lock_guard<std::mutex> lock(state().mutex);
  return state().generation;
}

void ContributionWindow::when_closed(std::function<void()> on_close) {
  std::lock_guard<std::mutex> lock(state().mutex);
  TORCH_CHECK(state().depth > 0, "ContributionWindow::when_closed: no window is open");
  state().on_close.push_back(std::move(on_close));
}

}  // namespace ulysses::sp
