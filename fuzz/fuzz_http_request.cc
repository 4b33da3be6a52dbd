// http::RequestParser fed a byte stream in pieces chosen by the input, and every request it
// yields turned into a plan by the HTTP API (supervisor/http_api.h) and rendered against an
// error reply, as a connection of warmpoold would.
//
// Input: [split byte][stream...]. Checked:
//   - the requests (method, path, query, headers, body), and whether the stream ends in an error,
//     do not depend on how the stream was split (the reference is the whole stream at once);
//   - no body is over the limit; an error is sticky;
//   - every immediate response and every rendered reply is a whole HTTP/1.1 response with a
//     status of 200..599 and the error in its endpoint's shape, and an immediate one carries the
//     code of an error (it is counted by it);
//   - typed tensors planned from KServe JSON (POST /v2/models/NAME/infer) are well-formed by the
//     rules the daemon judges them by, and write back as JSON that reads back to the same tensor;
//   - every query value read as a number (http/numbers.h) is taken only when it is decimal
//     digits alone, within the range, and reads back as the same number.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz/fuzz_check.h"
#include "http/numbers.h"
#include "http/request_parser.h"
#include "engines/tensors/tensor_proto.h"
#include "replyjson/kserve_json.h"
#include "supervisor/http_api.h"

namespace {

using warmpool::http::Request;
using warmpool::http::RequestParser;

constexpr uint64_t kMaxBody = 1024;

struct Parsed {
  std::vector<Request> requests;
  bool failed = false;
  int status = 0;
};

Parsed Parse(std::string_view stream, size_t step) {
  warmpool::http::ParserLimits limits;
  limits.max_header_bytes = 512;
  limits.max_body_bytes = kMaxBody;
  RequestParser parser(limits);
  Parsed out;
  std::string pending;
  for (size_t i = 0; i < stream.size() && !out.failed; i += step) {
    pending.append(stream.substr(i, step));
    while (!pending.empty()) {
      auto taken = parser.Feed(pending);
      if (!taken.ok()) {
        out.failed = true;
        out.status = parser.status_code();
        FUZZ_CHECK(!parser.Feed(std::string_view("GET / HTTP/1.1\r\n\r\n")).ok());
        break;
      }
      FUZZ_CHECK(*taken <= pending.size());
      pending.erase(0, *taken);
      auto request = parser.Next();
      if (request) {
        FUZZ_CHECK(request->body.size() <= kMaxBody);
        out.requests.push_back(std::move(*request));
      } else if (*taken == 0) {
        break;
      }
    }
  }
  return out;
}

bool Same(const Request& a, const Request& b) {
  return a.method == b.method && a.path == b.path && a.query == b.query && a.headers == b.headers &&
         a.body == b.body && a.keep_alive == b.keep_alive;
}

void CheckResponse(const std::string& response) {
  FUZZ_CHECK(response.rfind("HTTP/1.1 ", 0) == 0);
  const int status = std::atoi(response.c_str() + 9);
  FUZZ_CHECK(status >= 200 && status <= 599);
  FUZZ_CHECK(response.find("\r\n\r\n") != std::string::npos);
}

void CheckDecimal(const std::string& text) {
  constexpr uint64_t kMax = 4294967295u;
  auto value = warmpool::http::ParseDecimal(text, "fuzz", 0, kMax);
  bool digits = !text.empty();
  for (char c : text) digits = digits && c >= '0' && c <= '9';
  if (!value.ok()) {
    FUZZ_CHECK(value.status().code() == warmpool::Code::kInvalidArgument);
    // Refused: not digits, or digits of a number past the range.
    if (digits) {
      size_t first = text.find_first_not_of('0');
      FUZZ_CHECK(first != std::string::npos && text.size() - first >= 10);
    }
    return;
  }
  FUZZ_CHECK(digits && *value <= kMax);
  size_t first = text.find_first_not_of('0');
  FUZZ_CHECK(std::to_string(*value) == (first == std::string::npos ? "0" : text.substr(first)));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const size_t step = data[0] == 0 ? size : data[0];
  std::string_view stream(reinterpret_cast<const char*>(data + 1), size - 1);
  Parsed reference = Parse(stream, stream.size() + 1);
  Parsed split = Parse(stream, step);
  FUZZ_CHECK(reference.failed == split.failed);
  // Which error a bad request gets may depend on the split: a header over the limit is counted
  // as its bytes arrive, so a stream cut in small pieces can meet the limit (431) before the
  // parser meets a bad byte further on (400). That it fails, and what came before, may not.
  FUZZ_CHECK(reference.status == split.status || (reference.failed && split.failed));
  FUZZ_CHECK(reference.requests.size() == split.requests.size());
  for (size_t i = 0; i < reference.requests.size(); i++) {
    FUZZ_CHECK(Same(reference.requests[i], split.requests[i]));
  }
  warmpool::v1::Envelope error;
  error.mutable_error()->set_code(warmpool::v1::NOT_FOUND);
  error.mutable_error()->set_message("fuzz");
  for (const Request& r : reference.requests) {
    for (const auto& [key, value] : r.query) CheckDecimal(value);
    auto plan = warmpool::supervisor::httpapi::PlanRequest(r, r.keep_alive);
    if (plan.immediate) {
      CheckResponse(*plan.immediate);
      FUZZ_CHECK(plan.code != warmpool::Code::kOk);
      continue;
    }
    if (plan.kind == warmpool::supervisor::httpapi::Kind::kInferTensors) {
      for (const warmpool::v1::NamedTensor& t : plan.request.infer().inputs()) {
        FUZZ_CHECK(warmpool::tensors::CheckTensor(warmpool::tensors::ViewOf(t)).ok());
        auto json = warmpool::replyjson::KserveTensor(t);
        if (!json.ok()) continue;  // BYTES that are not UTF-8 (JSON's \u escapes can make them)
        auto back = warmpool::replyjson::TensorFromKserve(*json);
        FUZZ_CHECK(back.ok() && back->SerializeAsString() == t.SerializeAsString());
      }
    }
    std::string reply = warmpool::supervisor::httpapi::RenderReply(plan, error, true);
    CheckResponse(reply);
    // The error, with its status, in the shape of the endpoint's clients: text, or the
    // {"error": ...} of KServe's, Ollama's or OpenAI's.
    FUZZ_CHECK(reply.rfind("HTTP/1.1 404 ", 0) == 0);
    FUZZ_CHECK(reply.find("NOT_FOUND: fuzz\n") != std::string::npos ||
               reply.find("{\"error\":\"NOT_FOUND: fuzz\"}\n") != std::string::npos ||
               reply.find("{\"error\":\"fuzz\"}\n") != std::string::npos ||
               reply.find("\"message\":\"fuzz\"") != std::string::npos);
  }
  return 0;
}
