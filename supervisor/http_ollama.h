// Ollama's API on the HTTP API, translated to and from the daemon's own requests, so that Ollama's
// clients (its libraries, Open WebUI, editors' assistants) reach every registered language model:
//
//   GET  /api/version, /api/tags, /api/ps      the daemon's version, its language models, the loaded ones
//   POST /api/show                             one model's details
//   POST /api/generate                         a prompt (as it is: raw); an empty one loads the model,
//                                              or with keep_alive 0 unloads it, as Ollama's does
//   POST /api/chat                             messages through the model's chat template
//   POST /api/embed (and the older /api/embeddings)
//   /api/pull, /push, /create, /copy, /delete   refused: models are local directories here
//
// Streams (the default, as Ollama's) are NDJSON lines ending in one with "done": true and the
// counts; errors are {"error": "..."} with the status the code implies. keep_alive is Ollama's: a
// duration ("5m"), a number of seconds, 0 to release the model after the request, negative to
// keep it. Pure translation, as supervisor/http_api.h.
#pragma once

#include <string>

#include "common/status.h"
#include "http/request_parser.h"
#include "ipc/warmpool.pb.h"

namespace warmpool::supervisor::httpapi {

struct OllamaCall {
  enum class Endpoint { kGenerate, kChat, kEmbed, kEmbeddings, kLoad, kUnload, kTags, kPs, kShow, kVersion };
  Endpoint endpoint = Endpoint::kGenerate;
  std::string model;
  bool stream = true;
};

// The route's request into `out` (generate, embed, load, unload, models, ps; nothing for version),
// or the refusal. `call.endpoint` is set from the path and, for generate, what the body asks.
Status FillOllama(const http::Request& request, OllamaCall& call, v1::Envelope* out);
// The whole answer (or its error) to a call that did not stream.
std::string OllamaResponse(const OllamaCall& call, const v1::Envelope& reply, bool keep_alive);
// Streaming: a line per chunk, and the last (done, or the error after lines went out).
std::string OllamaStreamLine(const OllamaCall& call, const v1::GenerateChunk& chunk);
std::string OllamaStreamEnd(const OllamaCall& call, const v1::Envelope& reply);
std::string OllamaErrorResponse(const Status& error, bool keep_alive, int status = 0);

}  // namespace warmpool::supervisor::httpapi
