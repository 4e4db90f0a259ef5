// A TCP port that is free on this machine right now, for MASTER_PORT when a single-node launch
// gets no --master-port.
#pragma once

namespace ulysses::launch {

// Binds a TCP socket to port 0 on all interfaces, reads the port the kernel chose and closes the
// socket. Returns that port (1..65535). Another process may take it before the caller uses it;
// callers that cannot retry should pass an explicit port. Throws std::system_error when no socket
// can be bound.
int pick_free_port();

}  // namespace ulysses::launch
