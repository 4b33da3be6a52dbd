// The two addresses warmpoold listens on, checked where the configuration is read (boot.h) and
// again where they are bound (client_listen.cc): one parser, so that `warmpoold --check` and a
// start agree on what is valid.
#pragma once

#include <sys/socket.h>

#include <string>

#include "common/status.h"

namespace warmpool::supervisor {

// [http] listen: "HOST:PORT" or "[V6]:PORT". A loopback host (127.0.0.0/8 or ::1) unless every
// request must carry an API key (with_api_keys): without keys the API's reads and inference need
// no credentials.
Result<sockaddr_storage> ParseListenAddress(const std::string& address, bool with_api_keys);

// The client socket's path: short enough for a sockaddr_un, in a directory that exists.
Status CheckSocketPath(const std::string& path);

}  // namespace warmpool::supervisor
