// ipc::FrameDecoder fed a byte stream in pieces chosen by the input.
//
// Input: [max frame byte][split byte][stream...]. The frame limit is the first byte (0..255, small
// so that both accepted and oversized frames are easy to reach); the second byte seeds the piece
// sizes (0: the whole stream in one Append). After every Append the decoder is drained, using both
// Next overloads. Checked against a reference decoding of the whole stream:
//   - frames come out exactly as the reference cuts them, in order, each body <= the limit;
//   - buffered() is the size of the incomplete tail and stays under 4 + limit;
//   - an oversized prefix is an error iff the reference meets one; the error is sticky (every later
//     Append returns it, Next yields nothing, nothing stays buffered);
//   - the decoding does not depend on how the stream was split.
#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz/fuzz_check.h"
#include "ipc/framing.h"

namespace {

using warmpool::ipc::FrameDecoder;
using warmpool::ipc::kFramePrefixBytes;

struct Reference {
  std::vector<std::string_view> frames;
  bool oversized = false;  // stopped at a prefix above the limit
  size_t tail = 0;         // bytes of an incomplete frame at the end (when not oversized)
};

Reference Decode(std::string_view stream, uint32_t max) {
  Reference ref;
  size_t pos = 0;
  while (stream.size() - pos >= kFramePrefixBytes) {
    const auto* b = reinterpret_cast<const unsigned char*>(stream.data() + pos);
    uint32_t length = uint32_t{b[0]} | uint32_t{b[1]} << 8 | uint32_t{b[2]} << 16 | uint32_t{b[3]} << 24;
    if (length > max) {
      ref.oversized = true;
      return ref;
    }
    if (stream.size() - pos - kFramePrefixBytes < length) break;
    ref.frames.push_back(stream.substr(pos + kFramePrefixBytes, length));
    pos += kFramePrefixBytes + length;
  }
  ref.tail = stream.size() - pos;
  return ref;
}

// A tiny deterministic generator for piece sizes.
struct Rng {
  uint32_t state;
  uint32_t Next() {
    state ^= state << 13;
    state ^= state >> 17;
    state ^= state << 5;
    return state;
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const uint32_t max = data[0];
  const uint8_t split = data[1];
  const std::string_view stream(reinterpret_cast<const char*>(data + 2), size - 2);
  const Reference ref = Decode(stream, max);

  FrameDecoder decoder(max);
  Rng rng{0x9E3779B9u ^ split};
  size_t next_frame = 0;
  size_t fed = 0;
  bool failed = false;
  while (fed < stream.size() || fed == 0) {
    // 0 to 64 bytes a piece, empty pieces included.
    size_t piece = split == 0 ? stream.size() : rng.Next() % (split % 64 + 2);
    piece = std::min(piece, stream.size() - fed);
    warmpool::Status status = decoder.Append(std::span<const char>(stream.data() + fed, piece));
    fed += piece;
    if (!status.ok()) {
      FUZZ_CHECK(status.code() == warmpool::Code::kResourceExhausted);
      FUZZ_CHECK(ref.oversized);
      FUZZ_CHECK(!decoder.error().ok());
      failed = true;
      break;
    }
    FUZZ_CHECK(decoder.error().ok());
    // Drain, alternating the overloads as the generator says.
    for (;;) {
      std::string copy;
      std::string_view view;
      bool by_view = rng.Next() & 1;
      bool got = by_view ? decoder.Next(view) : decoder.Next(copy);
      if (!got) break;
      std::string_view body = by_view ? view : std::string_view(copy);
      FUZZ_CHECK(body.size() <= max);
      FUZZ_CHECK(next_frame < ref.frames.size());
      FUZZ_CHECK(body == ref.frames[next_frame]);
      next_frame++;
    }
    // Only an incomplete frame is left, and it is smaller than a prefix plus the largest body.
    FUZZ_CHECK(decoder.buffered() < kFramePrefixBytes + max);
    if (stream.empty()) break;
  }

  if (failed) {
    // Sticky: the same error from every later call, nothing more to read, nothing held.
    const std::string message = decoder.error().message();
    FUZZ_CHECK(decoder.buffered() == 0);
    std::string body;
    std::string_view view;
    FUZZ_CHECK(!decoder.Next(body));
    FUZZ_CHECK(!decoder.Next(view));
    const char more[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // even a valid empty frame
    for (int i = 0; i < 2; i++) {
      warmpool::Status again = decoder.Append(std::span<const char>(more, i == 0 ? 0 : sizeof(more)));
      FUZZ_CHECK(!again.ok());
      FUZZ_CHECK(again.code() == warmpool::Code::kResourceExhausted);
      FUZZ_CHECK(again.message() == message);
      FUZZ_CHECK(!decoder.Next(body));
      FUZZ_CHECK(decoder.buffered() == 0);
    }
    FUZZ_CHECK(next_frame <= ref.frames.size());
  } else {
    FUZZ_CHECK(!ref.oversized);
    FUZZ_CHECK(next_frame == ref.frames.size());
    FUZZ_CHECK(decoder.buffered() == ref.tail);
  }
  return 0;
}
