#include "ipc/framing.h"

#include <cstring>

namespace warmpool::ipc {

namespace {

uint32_t ReadPrefix(const char* p) {
  const auto* b = reinterpret_cast<const unsigned char*>(p);
  return uint32_t{b[0]} | uint32_t{b[1]} << 8 | uint32_t{b[2]} << 16 | uint32_t{b[3]} << 24;
}

}  // namespace

Status AppendFrame(std::string& out, const google::protobuf::MessageLite& message) {
  size_t size = message.ByteSizeLong();
  if (size > UINT32_MAX) {
    return Error(Code::kResourceExhausted, "message of {} bytes does not fit in one frame", size);
  }
  size_t at = out.size();
  out.resize(at + kFramePrefixBytes + size);
  auto n = static_cast<uint32_t>(size);
  char prefix[4] = {static_cast<char>(n & 0xFF), static_cast<char>((n >> 8) & 0xFF),
                    static_cast<char>((n >> 16) & 0xFF), static_cast<char>((n >> 24) & 0xFF)};
  std::memcpy(out.data() + at, prefix, 4);
  if (!message.SerializeWithCachedSizesToArray(
          reinterpret_cast<uint8_t*>(out.data() + at + kFramePrefixBytes))) {
    out.resize(at);
    return Error(Code::kInternal, "cannot serialize a {}", message.GetTypeName());
  }
  return OkStatus();
}

std::string Frame(const google::protobuf::MessageLite& message) {
  std::string out;
  (void)AppendFrame(out, message);
  return out;
}

Status FrameDecoder::Append(std::span<const char> bytes) {
  if (!error_.ok()) return error_;
  // Compact so that a long-lived connection does not keep consumed bytes around.
  if (consumed_ > 0 && (consumed_ == buffer_.size() || consumed_ > (1u << 16))) {
    buffer_.erase(0, consumed_);
    consumed_ = 0;
  }
  buffer_.append(bytes.data(), bytes.size());
  // Check every prefix now in the buffer: an oversized frame is refused as soon as its length is
  // known, so at most one read's worth of its body is ever held. Callers read in bounded chunks.
  size_t pos = consumed_;
  while (buffer_.size() - pos >= kFramePrefixBytes) {
    uint32_t length = ReadPrefix(buffer_.data() + pos);
    if (length > max_frame_bytes_) {
      error_ = Error(Code::kResourceExhausted,
                     "frame of {} bytes exceeds the limit of {} bytes (raise [limits] "
                     "max_frame_bytes or send smaller batches)",
                     length, max_frame_bytes_);
      buffer_.clear();
      consumed_ = 0;
      return error_;
    }
    if (buffer_.size() - pos - kFramePrefixBytes < length) break;
    pos += kFramePrefixBytes + length;
  }
  return OkStatus();
}

bool FrameDecoder::Next(std::string& body) {
  std::string_view view;
  if (!Next(view)) return false;
  body.assign(view);
  return true;
}

bool FrameDecoder::HasFrame() const {
  if (buffer_.size() - consumed_ < kFramePrefixBytes) return false;
  const uint32_t length = ReadPrefix(buffer_.data() + consumed_);
  return length <= max_frame_bytes_ && buffer_.size() - consumed_ - kFramePrefixBytes >= length;
}

bool FrameDecoder::Next(std::string_view& body) {
  if (buffer_.size() - consumed_ < kFramePrefixBytes) return false;
  uint32_t length = ReadPrefix(buffer_.data() + consumed_);
  if (length > max_frame_bytes_) return false;
  if (buffer_.size() - consumed_ - kFramePrefixBytes < length) return false;
  body = std::string_view(buffer_.data() + consumed_ + kFramePrefixBytes, length);
  consumed_ += kFramePrefixBytes + length;
  return true;
}

}  // namespace warmpool::ipc
