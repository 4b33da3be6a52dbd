// HTTP/1.1 responses as bytes: a whole one (Content-Length), or the head of a chunked one and its
// chunks (Transfer-Encoding: chunked), for a body that is written as it is known (load progress).
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace warmpool::http {

using Headers = std::vector<std::pair<std::string, std::string>>;

std::string Response(int status, std::string_view content_type, std::string_view body,
                     bool keep_alive, const Headers& extra = {});
std::string ChunkedHead(int status, std::string_view content_type, bool keep_alive,
                        const Headers& extra = {});
std::string Chunk(std::string_view data);  // data must not be empty
// A response (or a chunked one's head) with more header lines, after its status line.
std::string WithHeaders(std::string response, const Headers& extra);
std::string LastChunk();

// The status that tells an HTTP client what a warmpool code means.
int StatusFor(Code code);
// A response for an error: its status, and `CODE: message` as text, the words of the CLI.
std::string ErrorResponse(const Status& error, bool keep_alive, int status = 0);
std::string_view Reason(int status);

}  // namespace warmpool::http
