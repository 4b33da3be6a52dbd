// The HTTP/JSON API: what each endpoint asks of the daemon (the same Envelope the framed protocol
// carries, so access checks, limits and answers are the framed protocol's), and how the reply is
// written back. Pure translation: no sockets, no loop (supervisor/http_session.h carries it).
//
//   GET    /v1/models                  models, as OpenAI's list, each entry with the CLI's
//                                      `models --json` fields too (supervisor/http_openai.h)
//   POST   /v1/chat/completions, /v1/completions, /v1/embeddings: OpenAI's (http_openai.h)
//   /api/...                           Ollama's (http_ollama.h)
//   GET    /v1/ps                      ps
//   GET    /v1/status                  status
//   POST   /v1/models/NAME/load        {"replicas": N, "keep_alive": "5m"}; progress as NDJSON lines
//   POST   /v1/models/NAME/unload      {"park": true}
//   POST   /v1/unload                  every loaded model (parked where the park budget allows)
//   POST   /v1/models/NAME/pin, /unpin
//   POST   /v1/models/NAME/generate    {"prompt": P, "max_tokens": N, ...}; NDJSON lines as the text
//                                      is generated (supervisor/http_generate.h)
//   POST   /v1/models/NAME/infer       JSON rows, or {"input": rows, "deadline_ms": N,
//                                      "keep_alive": D}; or f32 bytes (application/octet-stream)
//                                      with X-Warmpool-Rows
//   POST   /v2/models/NAME/infer       typed tensors, as KServe's v2 protocol (supervisor/http_tensors.h)
//   GET    /v2/models/NAME             what it takes and gives, as that protocol's model metadata
//   PUT    /v1/models/NAME             {"path": P, "engine": E} registers; DELETE forgets
//   POST   /v1/faults                  {"point", "action", "model", "after", "times"}; DELETE clears
//   GET    /metrics                    Prometheus text (metrics/prometheus.h)
//
// Errors: the status that fits the code (http::StatusFor) and `CODE: message` as text/plain.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "http/request_parser.h"
#include "ipc/warmpool.pb.h"
#include "supervisor/http_ollama.h"
#include "supervisor/http_openai.h"

namespace warmpool::supervisor::httpapi {

enum class Kind { kMetrics, kModels, kPs, kStatus, kLoad, kUnload, kPin, kInfer, kRegister, kFaultArm, kFaultClear,
                  kGenerate, kEmbed, kInferTensors, kModelMetadata };

struct Plan {
  Kind kind = Kind::kModels;
  // Set: answered at once with this complete response (a bad request, an unknown endpoint).
  std::optional<std::string> immediate;
  Code code = Code::kOk;  // of `immediate`, for the metrics
  v1::Envelope request;  // for the daemon (request_id set by the session)
  std::string model;     // load: whose progress to report
  bool binary_output = false;  // infer: f32 bytes out
  bool stream = false;         // generate: NDJSON lines as chunks come
  std::optional<std::string> tensors_id;  // infer tensors: the request's "id", echoed
  std::optional<OpenAiCall> openai;       // an OpenAI-compatible endpoint's call (http_openai.h)
  std::optional<OllamaCall> ollama;       // an Ollama endpoint's call (http_ollama.h)
};

Plan PlanRequest(const http::Request& request, bool keep_alive);
// A request answered at once with an error, in its endpoint's dialect (`status`: 0 for the one the
// code implies).
Plan Refusal(const http::Request& request, const Status& why, bool keep_alive, int status = 0);
// The complete response to a reply Envelope (an error reply included).
std::string RenderReply(const Plan& plan, const v1::Envelope& reply, bool keep_alive);
// The routes of the other APIs' paths (`only` refuses a method other than the one it names, with
// a 405): /api/... (supervisor/http_ollama.cc) and /v2/models/... (supervisor/http_tensors.cc).
using MethodCheck = std::function<Status(const char* allowed)>;
Result<Plan> PlanOllama(const http::Request& request, const MethodCheck& only);
Result<Plan> PlanTensors(const http::Request& request, const MethodCheck& only);

// A streamed generation's body in the dialect of its endpoint: its content type, a chunk's text,
// and the end (the held text's last part, or the error after chunks went out).
const char* StreamType(const Plan& plan);
std::string StreamChunk(Plan& plan, const v1::GenerateChunk& chunk);
std::string StreamEnd(const Plan& plan, const v1::Envelope& reply);
// Load progress: one NDJSON line for the model's entry in status.loading, or "" when not listed.
std::string ProgressLine(const std::string& model, const v1::StatusReply& status);
// The last line of a streamed load: the reply (or its error, since the status line went out).
std::string FinalLoadLine(const v1::Envelope& reply);

}  // namespace warmpool::supervisor::httpapi
