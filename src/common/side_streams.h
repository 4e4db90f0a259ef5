// Side streams for copies between host and device that overlap the compute stream.
#pragma once
#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include <vector>

namespace ulysses {

// One stream from the device's pool per device it is asked for, the same one on every later call.
// The owner synchronizes them before it frees memory that their copies may still read or write.
class SideStreams {
 public:
  c10::Stream get(c10::Device device);
  // Waits for all the work queued on every stream handed out so far.
  void synchronize() const;

 private:
  std::vector<c10::Stream> streams_;
};

}  // namespace ulysses
