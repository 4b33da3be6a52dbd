#include "ipc/blocking_channel.h"

#include <cerrno>
#include <cstring>

#include "ipc/socket_io.h"

namespace warmpool::ipc {

Status BlockingChannel::Read(google::protobuf::MessageLite& message, std::vector<int>* fds) {
  std::string_view body;  // points into the decoder until the next Append
  char buffer[64 * 1024];
  while (!decoder_.Next(body)) {
    ssize_t n = RecvWithFds(fd_, buffer, sizeof(buffer), pending_fds_);
    if (n == 0) return Error(Code::kUnavailable, "the peer closed the connection");
    if (n < 0) {
      return Error(Code::kUnavailable, "reading from the peer failed: {}", std::strerror(errno));
    }
    if (Status s = decoder_.Append({buffer, static_cast<size_t>(n)}); !s.ok()) return s;
  }
  if (fds != nullptr) {
    fds->insert(fds->end(), pending_fds_.begin(), pending_fds_.end());
    pending_fds_.clear();
  }
  if (!message.ParseFromArray(body.data(), static_cast<int>(body.size()))) {
    return Error(Code::kInvalidArgument, "received a frame of {} bytes that is not a valid {}",
                 body.size(), message.GetTypeName());
  }
  return OkStatus();
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
