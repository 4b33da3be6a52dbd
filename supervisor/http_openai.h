// The OpenAI-compatible endpoints of the HTTP API, translated to and from the daemon's own requests
// (generate, embed, models), so that the `openai` libraries and every tool built on them reach any
// registered model, loaded on demand under the budget as for the framed protocol:
//
//   GET  /v1/models             {"object": "list", "data": [{"id", "object": "model", ...}]}; each
//                               entry carries warmpool's own fields too (engine, state, sizes)
//   POST /v1/chat/completions   messages through the model's chat template
//   POST /v1/completions        a prompt as it is
//   POST /v1/embeddings         input: a string or a list of them
//
// Streaming is server-sent events: `data: {chunk}` lines, then `data: [DONE]`; with
// stream_options.include_usage, a last chunk with the usage and no choices. Errors are OpenAI's
// object, {"error": {"message", "type", "param", "code"}}, with the status the code implies. Pure
// translation, as supervisor/http_api.h.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "common/status.h"
#include "http/request_parser.h"
#include "ipc/warmpool.pb.h"

namespace warmpool::supervisor::httpapi {

// What a response needs of its request: which endpoint, which model (as the client named it),
// the id and time every chunk repeats, and the streaming options.
struct OpenAiCall {
  enum class Endpoint { kChat, kCompletion, kEmbeddings } endpoint = Endpoint::kChat;
  std::string model;
  std::string id;        // "chatcmpl-...", "cmpl-..."
  int64_t created = 0;   // unix seconds
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool logprobs = false;
  bool base64 = false;  // embeddings: each vector as its floats' bytes in base64
  uint32_t tool_calls_streamed = 0;  // a stream's tool calls so far: the next one's index
};

// The body as a generate request (chat: messages; completion: prompt) or an embed request.
Status FillOpenAiGenerate(const http::Request& request, OpenAiCall& call, v1::GenerateRequest* out);
Status FillOpenAiEmbed(const http::Request& request, OpenAiCall& call, v1::EmbedRequest* out);

// GET /v1/models: the models reply as OpenAI's list.
std::string OpenAiModelsResponse(const v1::Envelope& reply, bool keep_alive);
// The whole answer to a call that did not stream (or its error).
std::string OpenAiResponse(const OpenAiCall& call, const v1::Envelope& reply, bool keep_alive);
// Streaming: one `data:` event per chunk, and the end (the last chunk with the finish reason, the
// usage when asked for, `data: [DONE]`; or the error, as an event, after chunks went out).
std::string OpenAiStreamEvent(OpenAiCall& call, const v1::GenerateChunk& chunk);
std::string OpenAiStreamEnd(const OpenAiCall& call, const v1::Envelope& reply);
// An error as OpenAI's object (`status`: 0 for the one the code implies).
std::string OpenAiErrorResponse(const Status& error, bool keep_alive, int status = 0);

}  // namespace warmpool::supervisor::httpapi
