// HTTP/1.1 requests from a byte stream, on Node's http_parser (Debian's libhttp-parser): requests
// arrive in arbitrary pieces, several may be pipelined on one connection, and every limit (the
// header block, the body, the target) is checked as the bytes come, before they are buffered.
// Parsing stops at the first complete request until the caller takes it (Next), so a client that
// pipelines faster than it is answered is held back by the socket, not by our memory.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "common/status.h"

namespace warmpool::http {

struct Request {
  std::string method;  // "GET", "POST", ...
  std::string path;    // the target before '?', percent-decoded
  std::map<std::string, std::string> query;    // percent-decoded; a key without value maps to ""
  std::map<std::string, std::string> headers;  // names lower-cased; repeated ones joined by ", "
  std::string body;
  bool keep_alive = true;
  bool http11 = true;  // HTTP/1.1 (chunked responses allowed); false for HTTP/1.0

  // The header's value, or "".
  const std::string& Header(const std::string& lower_name) const;
};

struct ParserLimits {
  uint32_t max_header_bytes = 16 << 10;  // request line and headers together
  uint64_t max_body_bytes = 64ull << 20;
};

class RequestParser {
 public:
  explicit RequestParser(ParserLimits limits = {});
  ~RequestParser();
  RequestParser(const RequestParser&) = delete;
  RequestParser& operator=(const RequestParser&) = delete;

  // Consumes what it can of bytes; returns how many it took (fewer than given while a complete
  // request waits for Next). After an error every call returns it: INVALID_ARGUMENT for a bad
  // request, RESOURCE_EXHAUSTED for one over a limit. `status_code` says which HTTP status fits.
  Result<size_t> Feed(std::span<const char> bytes);
  // The complete request parsed, if any (parsing goes on at the next Feed).
  std::optional<Request> Next();
  // Parsing a request has begun and is not complete (an EOF now cuts it off).
  bool mid_request() const;
  // The request being read asked for "Expect: 100-continue" before its body (once per request).
  bool TakeExpectsContinue();
  // 400, 413 (body), 431 (headers), 414 (target) or 505 (version), after an error.
  int status_code() const { return status_code_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  Status error_;
  int status_code_ = 400;
};

// "%41b+c" -> "Ab c" (in a query); "" on a malformed escape.
std::optional<std::string> PercentDecode(std::string_view text, bool plus_is_space);

}  // namespace warmpool::http

namespace warmpool::http {

// What the first bytes of a Unix-socket connection say it speaks. A framed client's first four
// bytes are a little-endian length; no HTTP method's first four bytes read as one below 512 MiB,
// so a frame of those exact lengths (7 values, all over the default 64 MiB limit) is the only
// thing taken for HTTP that is not.
enum class Sniffed { kNeedMore, kFramed, kHttp };
Sniffed SniffFirstBytes(std::string_view first);

}  // namespace warmpool::http
