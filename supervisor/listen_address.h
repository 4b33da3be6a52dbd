// The two addresses warmpoold listens on, checked where the configuration is read (boot.h) and
// again where they are bound (client_listen.cc): one parser, so that `warmpoold --check` and a
// start agree on what is valid.
#pragma once

#include <sys/socket.h>

#include <string>

#include "common/status.h"

namespace warmpool::supervisor {

// [http] listen: "HOST:PORT" or "[V6]:PORT" with a loopback host (127.0.0.0/8 or ::1); the HTTP
// API has no TLS and its reads need no credentials.
Result<sockaddr_storage> ParseLoopbackAddress(const std::string& address);

// The client socket's path: short enough for a sockaddr_un, in a directory that exists.
Status CheckSocketPath(const std::string& path);

}  // namespace warmpool::supervisor
