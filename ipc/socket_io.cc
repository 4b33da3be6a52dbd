#include "ipc/socket_io.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace warmpool::ipc {

ssize_t SendWithFds(int socket, const char* data, size_t length, std::span<const int> fds) {
  const iovec iov{const_cast<char*>(data), length};
  return SendvWithFds(socket, {&iov, 1}, fds);
}

ssize_t SendvWithFds(int socket, std::span<const iovec> buffers, std::span<const int> fds) {
  msghdr msg{};
  msg.msg_iov = const_cast<iovec*>(buffers.data());
  msg.msg_iovlen = buffers.size();
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)];
  if (!fds.empty()) {
    size_t n = std::min(fds.size(), kMaxFdsPerMessage);
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * n);
    cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(int) * n);
    std::memcpy(CMSG_DATA(cmsg), fds.data(), sizeof(int) * n);
  }
  ssize_t n;
  do {
    n = sendmsg(socket, &msg, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  return n;
}

ssize_t RecvWithFds(int socket, char* buffer, size_t length, std::vector<int>& fds) {
  iovec iov{buffer, length};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)];
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n;
  do {
    n = recvmsg(socket, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return n;
  for (cmsghdr* cmsg = CMSG_FIRSTHDR(&msg); cmsg != nullptr; cmsg = CMSG_NXTHDR(&msg, cmsg)) {
    if (cmsg->cmsg_level != SOL_SOCKET || cmsg->cmsg_type != SCM_RIGHTS) continue;
    size_t count = (cmsg->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    const auto* data = reinterpret_cast<const int*>(CMSG_DATA(cmsg));
    for (size_t i = 0; i < count; i++) fds.push_back(data[i]);
  }
  // Descriptors beyond our control buffer were dropped by the kernel (MSG_CTRUNC); nothing to free.
  return n;
}

}  // namespace warmpool::ipc
