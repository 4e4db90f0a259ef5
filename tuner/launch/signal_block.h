// SIGINT, SIGTERM and SIGCHLD blocked in a scope, so that they are taken with sigtimedwait where
// the code is ready for them, not by their default actions at any moment.
#pragma once
#include <signal.h>

namespace ulysses::launch {

// Blocks SIGINT, SIGTERM and SIGCHLD in the calling thread (and the threads it creates) for its
// lifetime, or until release(); then restores the mask it found. A signal still pending then is
// delivered with its action (SIGINT and SIGTERM end the process), unless release() took it.
class SignalBlock {
 public:
  explicit SignalBlock(bool block = true) : blocked_(block) {
    sigemptyset(&set_);
    sigaddset(&set_, SIGINT);
    sigaddset(&set_, SIGTERM);
    sigaddset(&set_, SIGCHLD);
    sigemptyset(&previous_);
    if (blocked_) pthread_sigmask(SIG_BLOCK, &set_, &previous_);
  }
  ~SignalBlock() {
    if (blocked_) pthread_sigmask(SIG_SETMASK, &previous_, nullptr);
  }
  SignalBlock(const SignalBlock&) = delete;
  SignalBlock& operator=(const SignalBlock&) = delete;

  const sigset_t& set() const { return set_; }
  const sigset_t& previous() const { return previous_; }

  // Takes every blocked signal still pending for the process or this thread (a SIGCHLD goes
  // with nothing to do), restores the mask and returns the last SIGINT or SIGTERM taken, 0 for
  // none. For a scope whose work is done: a stop asked for after it ends nothing.
  int release() {
    if (!blocked_) return 0;
    int stop = 0;
    const timespec now{0, 0};
    for (int taken; (taken = sigtimedwait(&set_, nullptr, &now)) > 0;) {
      if (taken != SIGCHLD) stop = taken;
    }
    pthread_sigmask(SIG_SETMASK, &previous_, nullptr);
    blocked_ = false;
    return stop;
  }

 private:
  bool blocked_;
  sigset_t set_;
  sigset_t previous_;
};

}  // namespace ulysses::launch
