// Client envelopes as the daemon meets them: frames cut from the input by ipc::FrameDecoder (and
// the whole input as one body), each parsed as a v1::Envelope and judged by CheckRequest; a refusal
// becomes the error reply the daemon would send, which must frame, decode and parse back intact.
// Every body is also parsed as a v1::WorkerEnvelope, the worker channel's message.
//
// Checked: CheckRequest only ever refuses with INVALID_ARGUMENT or FAILED_PRECONDITION and judges
// a re-parsed copy the same way; every message re-serializes and re-parses to the same bytes; an
// error reply (whose message quotes client input) is always a valid message.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include <google/protobuf/stubs/logging.h>

#include "fuzz/fuzz_check.h"
#include "ipc/framing.h"
#include "ipc/warmpool.pb.h"
#include "ipc/worker.pb.h"
#include "supervisor/core/request_check.h"
#include "supervisor/core/request_check.h"

namespace {

using namespace warmpool;

// Serialize, parse back, serialize again: the same bytes, the same message.
template <typename Message>
Message RoundTrip(const Message& message) {
  std::string bytes;
  FUZZ_CHECK(message.SerializeToString(&bytes));
  Message again;
  FUZZ_CHECK(again.ParseFromString(bytes));
  std::string bytes_again;
  FUZZ_CHECK(again.SerializeToString(&bytes_again));
  FUZZ_CHECK(bytes == bytes_again);
  return again;
}

void OneBody(std::string_view body) {
  v1::Envelope request;
  if (request.ParseFromArray(body.data(), static_cast<int>(body.size()))) {
    Status status = supervisor::CheckRequest(request);
    FUZZ_CHECK(status.ok() || status.code() == Code::kInvalidArgument ||
               status.code() == Code::kFailedPrecondition);
    FUZZ_CHECK(status.ok() == status.message().empty());

    v1::Envelope copy = RoundTrip(request);
    Status again = supervisor::CheckRequest(copy);
    FUZZ_CHECK(again.code() == status.code() && again.message() == status.message());

    if (!status.ok()) {
      // The reply travels the way the daemon sends it: one frame on the client's stream.
      v1::Envelope reply = supervisor::ErrorReply(request.request_id(), status);
      std::string frame;
      FUZZ_CHECK(ipc::AppendFrame(frame, reply).ok());
      ipc::FrameDecoder decoder;
      FUZZ_CHECK(decoder.Append(std::span<const char>(frame.data(), frame.size())).ok());
      std::string_view reply_body;
      FUZZ_CHECK(decoder.Next(reply_body));
      FUZZ_CHECK(decoder.buffered() == 0);
      v1::Envelope parsed;
      FUZZ_CHECK(parsed.ParseFromArray(reply_body.data(), static_cast<int>(reply_body.size())));
      FUZZ_CHECK(parsed.request_id() == request.request_id());
      FUZZ_CHECK(parsed.has_error());
      FUZZ_CHECK(CodeFromInt(parsed.error().code()) == status.code());
      FUZZ_CHECK(parsed.error().message() == status.message());
    }
  }

  v1::WorkerEnvelope worker;
  if (worker.ParseFromArray(body.data(), static_cast<int>(body.size()))) {
    (void)RoundTrip(worker);
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);  // invalid UTF-8 and the like would log on every run
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  OneBody(input);

  ipc::FrameDecoder decoder(1u << 20);
  if (!decoder.Append(std::span<const char>(input.data(), input.size())).ok()) return 0;
  std::string_view body;
  while (decoder.Next(body)) OneBody(body);
  return 0;
}
