#pragma once

#include <string>

namespace warmpool {

// $XDG_RUNTIME_DIR/warmpool.sock, else /tmp/warmpool-$UID.sock: the daemon's default and the
// clients' (which WARMPOOL_SOCKET overrides).
std::string DefaultSocketPath();
// Where the system service listens (systemd/warmpool.socket); clients fall back to it when the
// user runs no daemon of their own.
inline constexpr char kSystemSocketPath[] = "/run/warmpool/warmpool.sock";

// `name` in the directory of the running executable: how the binaries find each other
// (warmpoold its worker, the harness and the benchmark their daemon).
std::string NextToSelf(const std::string& name);

}  // namespace warmpool
