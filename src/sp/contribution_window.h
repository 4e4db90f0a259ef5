// Gradient contributions that belong together. A tiled computation (sequence_tiled_compute) runs
// one backward per tile, so each of its weights receives one gradient contribution per tile. A
// consumer that moves every contribution somewhere costly (GradientBuffers moving gradients to the
// host for optimizer offload) can keep the contributions that arrive while a window is open where
// they are, sum them there, and move the sum once when the outermost window closes.
#pragma once
#include <functional>

namespace ulysses::sp {

// Opens a window for the lifetime of the object; windows nest, and the state is process-wide (the
// contributions arrive on autograd's threads, not necessarily the one that opened the window).
// Not copyable.
class ContributionWindow {
 public:
  ContributionWindow();
  // Closing the outermost window runs, on this thread and in the order given, every callback
  // registered while it was open. When the window closes because of an exception, the callbacks
  // are dropped (a consumer must not depend on them for correctness: GradientBuffers moves what
  // is left when it settles). A callback that throws propagates out of this destructor.
  ~ContributionWindow() noexcept(false);
  ContributionWindow(const ContributionWindow&) = delete;
  ContributionWindow& operator=(const ContributionWindow&) = delete;

  static bool is_open();
  // Counts outermost windows opened so far: a consumer registers once per window by remembering
  // the generation it registered in.
  static unsigned long long generation();
  // Runs `on_close` when the outermost window closes. REQUIRES: is_open().
  static void when_closed(std::function<void()> on_close);

 private:
  int uncaught_at_open_;
};

}  // namespace ulysses::sp
