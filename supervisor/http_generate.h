// POST /v1/models/NAME/generate on the HTTP API: the JSON body as a generate request, and its
// answer as NDJSON (application/x-ndjson) — a line per chunk ({"index", "text", "tokens"}) as the
// text is generated, then the final line ({"done": true, "finish_reason", ...}, or {"error",
// "code"} when the stream failed after lines went out). With "stream": false, one JSON object.
// And POST /v1/models/NAME/embed: {"input": "text" or ["text", ...]} as an embed request.
// Pure translation, as supervisor/http_api.h.
#pragma once

#include <string>

#include "common/status.h"
#include "http/request_parser.h"
#include "ipc/warmpool.pb.h"

namespace warmpool::supervisor::httpapi {

// The body's fields: prompt, tokens or messages ([{"role", "content"}]), max_tokens, temperature, top_k, top_p, min_p,
// repetition_penalty, seed, stop (a string or a list), stream (default true), deadline_ms,
// keep_alive. Any other key is INVALID_ARGUMENT.
Status FillGenerate(const http::Request& request, const std::string& model, v1::GenerateRequest* out);
// The body's fields: input (a string, or a list of 1 to 256 strings), deadline_ms, keep_alive.
Status FillEmbed(const http::Request& request, const std::string& model, v1::EmbedRequest* out);
// One NDJSON line (newline included).
std::string GenerateChunkLine(const v1::GenerateChunk& chunk);
// The final line of a stream: the reply, or its error.
std::string GenerateFinalLine(const v1::Envelope& reply);
// The whole answer without streaming, as a JSON document (newline included).
std::string GenerateReplyJson(const v1::GenerateReply& reply);

}  // namespace warmpool::supervisor::httpapi
