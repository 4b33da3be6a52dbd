// A framed channel over a blocking socket, for processes that do not run an event loop: workers
// (one reader thread, several writer threads) and the C++ client library.
#pragma once

#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include <google/protobuf/message_lite.h>

#include "common/status.h"
#include "ipc/framing.h"

namespace warmpool::ipc {

class BlockingChannel {
 public:
  BlockingChannel(int fd, uint32_t max_frame_bytes) : fd_(fd), decoder_(max_frame_bytes) {}
  ~BlockingChannel();  // closes received descriptors nobody took (not the socket)

  // Reads the next frame into message. UNAVAILABLE when the peer closed the channel, INVALID_ARGUMENT
  // on a message that does not parse, RESOURCE_EXHAUSTED on an oversized frame. One reader at a time.
  Status Read(google::protobuf::MessageLite& message);
  // Whether Read would find the start of a frame within timeout_us: one is buffered already, or
  // the socket becomes readable (then Read may still wait for the rest of the frame).
  bool WaitForFrame(int64_t timeout_us);
  // The oldest received descriptor not yet taken (the caller owns it), or -1. Descriptors are
  // queued in arrival order: a message that says it carries one takes it here.
  int TakeFd();
  // Writes one frame whole; safe from several threads (frames never interleave).
  Status Write(const google::protobuf::MessageLite& message, const std::vector<int>& fds = {});
  // Writes bytes that are already framed (pipelining several frames in one call).
  Status WriteRaw(const std::string& bytes);

  int fd() const { return fd_; }

 private:
  Status WriteLocked(const std::string& bytes, const std::vector<int>& fds);

  int fd_;
  FrameDecoder decoder_;
  std::deque<int> pending_fds_;
  std::mutex write_mutex_;
};

}  // namespace warmpool::ipc
