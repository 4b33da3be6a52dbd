#include "http/response.h"

#include <fmt/format.h>

#include "ipc/codes.h"

namespace warmpool::http {

std::string_view Reason(int status) {
  switch (status) {
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 415: return "Unsupported Media Type";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    case 505: return "HTTP Version Not Supported";
  }
  return "Unknown";
}

// The codes' table (ipc/codes.h) holds the mapping, so that the HTTP API, the CLI and the clients
// cannot disagree on it.
int StatusFor(Code code) { return ipc::HttpStatusOf(code); }

namespace {

std::string Head(int status, std::string_view content_type, bool keep_alive, const Headers& extra) {
  std::string out = fmt::format("HTTP/1.1 {} {}\r\nContent-Type: {}\r\n", status, Reason(status),
                                content_type);
  for (const auto& [name, value] : extra) out += fmt::format("{}: {}\r\n", name, value);
  // Said either way: an HTTP/1.0 client keeps the connection only when told it may.
  out += keep_alive ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
  return out;
}

}  // namespace

std::string Response(int status, std::string_view content_type, std::string_view body,
                     bool keep_alive, const Headers& extra) {
  std::string out = Head(status, content_type, keep_alive, extra);
  if (status == 204) return out + "\r\n";  // no content, and no Content-Length (RFC 9110, 8.6)
  out += fmt::format("Content-Length: {}\r\n\r\n", body.size());
  out += body;
  return out;
}

std::string ChunkedHead(int status, std::string_view content_type, bool keep_alive,
                        const Headers& extra) {
  return Head(status, content_type, keep_alive, extra) + "Transfer-Encoding: chunked\r\n\r\n";
}

std::string Chunk(std::string_view data) {
  return fmt::format("{:x}\r\n{}\r\n", data.size(), data);
}

std::string LastChunk() { return "0\r\n\r\n"; }

std::string WithHeaders(std::string response, const Headers& extra) {
  const size_t line_end = response.find("\r\n");
  if (extra.empty() || line_end == std::string::npos) return response;
  std::string lines;
  for (const auto& [name, value] : extra) lines += fmt::format("{}: {}\r\n", name, value);
  response.insert(line_end + 2, lines);
  return response;
}

std::string ErrorResponse(const Status& error, bool keep_alive, int status) {
  return Response(status != 0 ? status : StatusFor(error.code()), "text/plain; charset=utf-8",
                  error.ToString() + "\n", keep_alive);
}

}  // namespace warmpool::http
