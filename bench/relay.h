// The baseline of the benchmark: a raw two-hop Unix-socket path with warmpool's framing and nothing
// else. An echo server process returns every length-prefixed frame it reads; a relay process sits
// between clients and that server and forwards whole frames both ways (client -> relay -> server ->
// relay -> client), one thread per direction with blocking I/O. This is the floor that warmpool's
// client -> supervisor -> worker -> supervisor -> client path is compared against.
#pragma once

#include <sys/types.h>

#include <string>

#include "common/status.h"

namespace warmpool::bench {

// A listening Unix stream socket bound at path (close-on-exec).
Result<int> ListenUnix(const std::string& path);
// A connected Unix stream socket (close-on-exec).
Result<int> ConnectUnix(const std::string& path);

// Forwards complete frames read from in to out until in reaches EOF or an error occurs; every
// batch of complete frames read in one go is written in one go. in == out makes an echo.
void ForwardFrames(int in, int out);
// Relays frames both ways between a client and the server on one thread until either side ends.
void RelayPair(int client, int server);

// Forks a process that echoes frames on every connection accepted at socket_path. The socket is
// listening when this returns, so clients may connect at once.
Result<pid_t> ForkEchoServer(const std::string& socket_path);
// Forks a process that accepts clients at socket_path and, for each, opens a connection of its
// own to server_path and forwards frames both ways.
Result<pid_t> ForkRelay(const std::string& socket_path, const std::string& server_path);

}  // namespace warmpool::bench
