#pragma once

#include <string>

namespace warmpool {

// $XDG_RUNTIME_DIR/warmpool.sock, else /tmp/warmpool-$UID.sock: the daemon's default and the
// clients' (which WARMPOOL_SOCKET overrides).
std::string DefaultSocketPath();

}  // namespace warmpool
