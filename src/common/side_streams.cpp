#include "common/side_streams.h"

#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>

namespace ulysses {

c10::Stream SideStreams::get(c10::Device device) {
  auto stream = std::find_if(streams_.begin(), streams_.end(),
                             [&](const c10::Stream& s) { return s.device() == device; });
  if (stream != streams_.end()) return *stream;
  const c10::impl::VirtualGuardImpl impl(device.type());
  streams_.push_back(impl.getStreamFromGlobalPool(device, /*isHighPriority=*/false));
  return streams_.back();
}

void SideStreams::synchronize() const {
  for (const c10::Stream& stream : streams_) stream.synchronize();
}

}  // namespace ulysses
