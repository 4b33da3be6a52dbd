// sendmsg/recvmsg with SCM_RIGHTS: the only place that knows how file descriptors ride along with
// bytes. Used by the evented connection (supervisor) and the blocking channel (worker, client).
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <cstddef>
#include <span>
#include <vector>

namespace warmpool::ipc {

inline constexpr size_t kMaxFdsPerMessage = 16;

// Like send(2) with MSG_NOSIGNAL; fds are attached to the first byte sent. -1 with errno on error.
ssize_t SendWithFds(int socket, const char* data, size_t length, std::span<const int> fds);
// The same gathering several buffers into one sendmsg.
ssize_t SendvWithFds(int socket, std::span<const iovec> buffers, std::span<const int> fds);
// Like recv(2); received descriptors (close-on-exec) are appended to fds. -1 with errno on error.
ssize_t RecvWithFds(int socket, char* buffer, size_t length, std::vector<int>& fds);

}  // namespace warmpool::ipc
