#include "ipc/blocking_channel.h"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "ipc/socket_io.h"

namespace warmpool::ipc {

BlockingChannel::~BlockingChannel() {
  for (int fd : pending_fds_) close(fd);
}

int BlockingChannel::TakeFd() {
  if (pending_fds_.empty()) return -1;
  int fd = pending_fds_.front();
  pending_fds_.pop_front();
  return fd;
}

Status BlockingChannel::Read(google::protobuf::MessageLite& message) {
  std::string_view body;  // points into the decoder until the next Append
  char buffer[64 * 1024];
  while (!decoder_.Next(body)) {
    std::vector<int> fds;
    ssize_t n = RecvWithFds(fd_, buffer, sizeof(buffer), fds);
    pending_fds_.insert(pending_fds_.end(), fds.begin(), fds.end());
    if (n == 0) return Error(Code::kUnavailable, "the peer closed the connection");
    if (n < 0) {
      return Error(Code::kUnavailable, "reading from the peer failed: {}", std::strerror(errno));
    }
    if (Status s = decoder_.Append({buffer, static_cast<size_t>(n)}); !s.ok()) return s;
  }
  if (!message.ParseFromArray(body.data(), static_cast<int>(body.size()))) {
    return Error(Code::kInvalidArgument, "received a frame of {} bytes that is not a valid {}",
                 body.size(), message.GetTypeName());
  }
  return OkStatus();
}

bool BlockingChannel::WaitForFrame(int64_t timeout_us) {
  if (decoder_.HasFrame()) return true;
  pollfd p{fd_, POLLIN, 0};
  const int64_t wait_us = std::max<int64_t>(0, timeout_us);
  const timespec timeout{static_cast<time_t>(wait_us / 1000000), static_cast<long>(wait_us % 1000000) * 1000};
  int rc;
  do {
    rc = ppoll(&p, 1, &timeout, nullptr);  // microseconds, where poll has milliseconds
  } while (rc < 0 && errno == EINTR);
  return rc > 0;
}

Status BlockingChannel::Write(const google::protobuf::MessageLite& message,
                              const std::vector<int>& fds) {
  std::string frame;
  if (Status s = AppendFrame(frame, message); !s.ok()) return s;
  std::lock_guard lock(write_mutex_);
  return WriteLocked(frame, fds);
}

Status BlockingChannel::WriteRaw(const std::string& bytes) {
  std::lock_guard lock(write_mutex_);
  return WriteLocked(bytes, {});
}

Status BlockingChannel::WriteLocked(const std::string& bytes, const std::vector<int>& fds) {
  size_t sent = 0;
  bool fds_sent = fds.empty();
  while (sent < bytes.size()) {
    ssize_t n = SendWithFds(fd_, bytes.data() + sent, bytes.size() - sent,
                            fds_sent ? std::span<const int>() : std::span<const int>(fds));
    if (n < 0) {
      return Error(Code::kUnavailable, "writing to the peer failed: {}", std::strerror(errno));
    }
    fds_sent = true;
    sent += static_cast<size_t>(n);
  }
  return OkStatus();
}

}  // namespace warmpool::ipc
