// Framing of both channels: every frame is a 4-byte little-endian unsigned length N followed by N
// bytes holding one serialized protobuf message. The receiver checks N against its limit as soon as
// the 4 prefix bytes are in, before buffering any of the body: an oversized or hostile length costs
// nothing but the error. A length of 0 is a valid (empty) message.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include <google/protobuf/message_lite.h>

#include "common/status.h"

namespace warmpool::ipc {

inline constexpr size_t kFramePrefixBytes = 4;
inline constexpr uint32_t kDefaultMaxFrameBytes = 64u << 20;  // 64 MiB
inline constexpr uint32_t kProtocolVersion = 1;

// Appends the frame of message to out. Fails only if the message does not fit in 32 bits.
Status AppendFrame(std::string& out, const google::protobuf::MessageLite& message);
std::string Frame(const google::protobuf::MessageLite& message);

// Reassembles frames from a byte stream arriving in arbitrary pieces.
class FrameDecoder {
 public:
  explicit FrameDecoder(uint32_t max_frame_bytes = kDefaultMaxFrameBytes)
      : max_frame_bytes_(max_frame_bytes) {}

  // Buffers bytes. After an error (oversized frame) every call returns that error.
  Status Append(std::span<const char> bytes);
  // Copies the next complete frame body into body; false when none is complete yet.
  bool Next(std::string& body);
  // The same without a copy: body points into the decoder and stays valid until the next Append.
  bool Next(std::string_view& body);
  // Whether a complete frame is buffered (Next would return one).
  bool HasFrame() const;
  // Bytes of an incomplete frame held (0 at a frame boundary).
  size_t buffered() const { return buffer_.size() - consumed_; }
  const Status& error() const { return error_; }

 private:
  uint32_t max_frame_bytes_;
  std::string buffer_;
  size_t consumed_ = 0;
  Status error_;
};

}  // namespace warmpool::ipc
