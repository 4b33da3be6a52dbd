#include "supervisor/http_api.h"

#include <fmt/format.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "common/units.h"
#include "http/numbers.h"
#include "http/response.h"
#include "ipc/error_proto.h"
#include "replyjson/reply_json.h"
#include "supervisor/http_api_body.h"
#include "supervisor/http_generate.h"
#include "supervisor/http_tensors.h"

namespace warmpool::supervisor::httpapi {

using nlohmann::json;

namespace {

constexpr char kJson[] = "application/json";
constexpr char kBinary[] = "application/octet-stream";

Plan Refuse(const Status& why, bool keep_alive, int status = 0) {
  Plan plan;
  plan.immediate = http::ErrorResponse(why, keep_alive, status);
  plan.code = why.code();
  return plan;
}

bool Wants(const http::Request& request, std::string_view type) {
  return request.Header("accept").find(type) != std::string::npos;
}

// POST /v1/models/NAME/infer.
Result<Plan> PlanInfer(const http::Request& request, const std::string& model) {
  Plan plan;
  plan.kind = Kind::kInfer;
  v1::InferRequest* infer = plan.request.mutable_infer();
  infer->set_model(model);
  const std::string& type = request.Header("content-type");
  if (type.rfind(kBinary, 0) == 0) {
    const bool in_header = request.headers.count("x-warmpool-rows") != 0;
    if (!in_header && request.query.count("rows") == 0) {
      return Error(Code::kInvalidArgument,
                   "a binary input needs its row count: X-Warmpool-Rows: N (or ?rows=N)");
    }
    Result<uint64_t> rows_read =
        in_header ? http::ParseDecimal(request.Header("x-warmpool-rows"), "header X-Warmpool-Rows", 1, UINT32_MAX)
                  : http::ParseDecimal(request.query.at("rows"), "query parameter rows", 1, UINT32_MAX);
    if (!rows_read.ok()) return rows_read.status();
    const uint64_t rows = *rows_read;
    const uint64_t bytes = request.body.size();
    if (bytes == 0 || bytes % (rows * 4) != 0) {
      return Error(Code::kInvalidArgument,
                   "a binary input of {} bytes is not {} rows of little-endian f32 values", bytes, rows);
    }
    infer->mutable_input()->set_rows(static_cast<uint32_t>(rows));
    infer->mutable_input()->set_cols(static_cast<uint32_t>(bytes / (rows * 4)));
    infer->mutable_input()->set_data(request.body);
    if (auto it = request.query.find("deadline_ms"); it != request.query.end()) {
      Result<uint64_t> ms = http::ParseDecimal(it->second, "query parameter deadline_ms", 0, UINT32_MAX);
      if (!ms.ok()) return ms.status();
      infer->set_deadline_ms(static_cast<uint32_t>(*ms));
    }
    if (auto it = request.query.find("keep_alive"); it != request.query.end()) {
      Result<int64_t> ms = ParseDurationMs(it->second);
      if (!ms.ok()) {
        return Error(Code::kInvalidArgument, "query parameter keep_alive: {}", ms.status().message());
      }
      infer->set_keep_alive_ms(*ms);
    }
    plan.binary_output = true;
    return plan;
  }
  Result<json> parsed = ParseJson(request.body);
  if (!parsed.ok()) return parsed.status();
  const json& doc = *parsed;
  if (doc.is_discarded()) {
    return Error(Code::kInvalidArgument,
                 "the body is not valid JSON: send a list of rows, e.g. [[1, 2], [3, 4]], or "
                 "{{\"input\": rows}}; or f32 bytes as application/octet-stream");
  }
  const json* rows = &doc;
  if (doc.is_object()) {
    if (Status s = OnlyKeys(doc, {"input", "deadline_ms", "keep_alive"}, request); !s.ok()) return s;
    if (!doc.contains("input")) return Error(Code::kInvalidArgument, "the body has no \"input\" rows");
    rows = &doc["input"];
    Result<uint32_t> deadline = Uint(doc, "deadline_ms");
    if (!deadline.ok()) return deadline.status();
    infer->set_deadline_ms(*deadline);
    Result<std::optional<int64_t>> keep = KeepAlive(doc);
    if (!keep.ok()) return keep.status();
    if (*keep) infer->set_keep_alive_ms(**keep);
  }
  Result<client::Matrix> input = replyjson::MatrixFromJson(*rows);
  if (!input.ok()) return input.status();
  *infer->mutable_input() = client::ToTensor(*input);
  plan.binary_output = Wants(request, kBinary);
  return plan;
}

Result<Plan> PlanModelAction(const http::Request& request, const std::string& model,
                             const std::string& action) {
  Plan plan;
  plan.model = model;
  Result<json> body = BodyObject(request);
  if (!body.ok()) return body.status();
  if (action == "load") {
    if (Status s = OnlyKeys(*body, {"replicas", "keep_alive"}, request); !s.ok()) return s;
    plan.kind = Kind::kLoad;
    v1::LoadRequest* load = plan.request.mutable_load();
    load->set_model(model);
    Result<uint32_t> replicas = Uint(*body, "replicas");
    if (!replicas.ok()) return replicas.status();
    load->set_replicas(*replicas);
    Result<std::optional<int64_t>> keep = KeepAlive(*body);
    if (!keep.ok()) return keep.status();
    if (*keep) load->set_keep_alive_ms(**keep);
  } else if (action == "unload") {
    if (Status s = OnlyKeys(*body, {"park"}, request); !s.ok()) return s;
    plan.kind = Kind::kUnload;
    plan.request.mutable_unload()->set_model(model);
    Result<bool> park = Bool(*body, "park");
    if (!park.ok()) return park.status();
    plan.request.mutable_unload()->set_park(*park);
  } else if (action == "pin" || action == "unpin") {
    if (Status s = OnlyKeys(*body, {}, request); !s.ok()) return s;
    plan.kind = Kind::kPin;
    plan.request.mutable_pin()->set_model(model);
    plan.request.mutable_pin()->set_pin(action == "pin");
  } else {
    return Error(Code::kNotFound, "no endpoint /v1/models/{}/{}: load, unload, pin, unpin, infer, generate", model, action);
  }
  return plan;
}

// A refusal of the method (not of the path or the body) sets *status to 405.
Result<Plan> Route(const http::Request& request, int* status) {
  const std::string& path = request.path;
  const std::string& method = request.method;
  auto only = [&](const char* allowed) -> Status {
    if (method == allowed || (std::strcmp(allowed, "GET") == 0 && method == "HEAD")) return OkStatus();
    *status = 405;
    return Error(Code::kInvalidArgument, "{} {} is not served: use {}", method, path, allowed);
  };
  Plan plan;
  if (path == "/metrics") {
    if (Status s = only("GET"); !s.ok()) return s;
    plan.kind = Kind::kMetrics;
    return plan;
  }
  if (path == "/v1/models" || path == "/v1/ps" || path == "/v1/status") {
    if (Status s = only("GET"); !s.ok()) return s;
    if (path == "/v1/models") {
      plan.kind = Kind::kModels;
      plan.request.mutable_models();
    } else if (path == "/v1/ps") {
      plan.kind = Kind::kPs;
      plan.request.mutable_ps();
    } else {
      plan.kind = Kind::kStatus;
      plan.request.mutable_status();
    }
    return plan;
  }
  if (path == "/v1/unload") {
    if (Status s = only("POST"); !s.ok()) return s;
    Result<json> body = BodyObject(request);
    if (!body.ok()) return body.status();
    if (Status s = OnlyKeys(*body, {}, request); !s.ok()) return s;
    plan.kind = Kind::kUnload;
    plan.request.mutable_unload()->set_all(true);
    return plan;
  }
  if (path == "/v1/faults") {
    if (method == "DELETE") {
      plan.kind = Kind::kFaultClear;
      plan.request.mutable_fault_clear();
      return plan;
    }
    if (Status s = only("POST"); !s.ok()) return s;
    Result<json> body = BodyObject(request);
    if (!body.ok()) return body.status();
    if (Status s = OnlyKeys(*body, {"point", "action", "model", "after", "times"}, request); !s.ok()) return s;
    plan.kind = Kind::kFaultArm;
    v1::FaultArmRequest* arm = plan.request.mutable_fault_arm();
    Result<std::string> point = String(*body, "point"), action = String(*body, "action"),
                        model = String(*body, "model");
    for (const auto* field : {&point, &action, &model}) {
      if (!field->ok()) return field->status();
    }
    arm->set_point(*point);
    arm->set_action(*action);
    arm->set_model(*model);
    Result<uint32_t> after = Uint(*body, "after"), times = Uint(*body, "times");
    if (!after.ok()) return after.status();
    if (!times.ok()) return times.status();
    arm->set_after(*after);
    arm->set_times(*times);
    return plan;
  }
  if (path.rfind("/api/", 0) == 0) return PlanOllama(request, only);
  if (path == "/v1/chat/completions" || path == "/v1/completions" || path == "/v1/embeddings") {
    if (Status s = only("POST"); !s.ok()) return s;
    OpenAiCall call;
    if (path == "/v1/embeddings") {
      call.endpoint = OpenAiCall::Endpoint::kEmbeddings;
      plan.kind = Kind::kEmbed;
      if (Status s = FillOpenAiEmbed(request, call, plan.request.mutable_embed()); !s.ok()) return s;
    } else {
      call.endpoint = path == "/v1/completions" ? OpenAiCall::Endpoint::kCompletion : OpenAiCall::Endpoint::kChat;
      plan.kind = Kind::kGenerate;
      if (Status s = FillOpenAiGenerate(request, call, plan.request.mutable_generate()); !s.ok()) return s;
      plan.stream = call.stream;
    }
    plan.model = call.model;
    plan.openai = std::move(call);
    return plan;
  }
  if (path.rfind("/v2/models/", 0) == 0) return PlanTensors(request, only);
  constexpr std::string_view kModels = "/v1/models/";
  if (path.rfind(kModels, 0) == 0) {
    std::string rest = path.substr(kModels.size());
    size_t slash = rest.find('/');
    std::string model = rest.substr(0, slash);
    if (model.empty()) return Error(Code::kNotFound, "no model named in {}", path);
    if (slash == std::string::npos) {  // the model itself: register or forget
      if (method != "PUT" && method != "DELETE") {
        *status = 405;
        return Error(Code::kInvalidArgument, "{} {} is not served: PUT registers the model, DELETE forgets it", method, path);
      }
      plan.kind = Kind::kRegister;
      v1::RegisterRequest* reg = plan.request.mutable_register_model();
      reg->set_model(model);
      if (method == "DELETE") {
        reg->set_remove(true);
        return plan;
      }
      Result<json> body = BodyObject(request);
      if (!body.ok()) return body.status();
      if (Status s = OnlyKeys(*body, {"path", "engine"}, request); !s.ok()) return s;
      Result<std::string> file = String(*body, "path"), engine = String(*body, "engine");
      if (!file.ok()) return file.status();
      if (!engine.ok()) return engine.status();
      if (file->empty()) return Error(Code::kInvalidArgument, "registering needs {{\"path\": \"/absolute/path\"}}");
      reg->set_path(*file);
      reg->set_engine(*engine);
      return plan;
    }
    if (Status s = only("POST"); !s.ok()) return s;
    std::string action = rest.substr(slash + 1);
    if (action == "infer") return PlanInfer(request, model);
    if (action == "generate") {
      Plan plan;
      plan.kind = Kind::kGenerate;
      if (Status s = FillGenerate(request, model, plan.request.mutable_generate()); !s.ok()) return s;
      plan.stream = plan.request.generate().stream();
      return plan;
    }
    if (action == "embed") {
      Plan plan;
      plan.kind = Kind::kEmbed;
      if (Status s = FillEmbed(request, model, plan.request.mutable_embed()); !s.ok()) return s;
      return plan;
    }
    return PlanModelAction(request, model, action);
  }
  return Error(Code::kNotFound,
               "no endpoint {}: try GET /v1/models, /v1/ps, /v1/status, /metrics, or POST "
               "/v1/models/NAME/load|unload|pin|unpin|infer|generate|embed, /v2/models/NAME/infer; GET /v2/models/NAME",
               path);
}

// Strings from files (a model's path, a file's error) may not be UTF-8: replaced, never thrown.
std::string Dump(const json& doc) {
  return doc.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
}

std::string JsonResponse(const json& doc, bool keep_alive) {
  return http::Response(200, kJson, Dump(doc), keep_alive);
}

// The response to a reply; JSON errors throw (RenderReply catches them).
std::string Render(const Plan& plan, const v1::Envelope& reply, bool keep_alive);

}  // namespace

Plan PlanRequest(const http::Request& request, bool keep_alive) {
  Result<Plan> plan = Error(Code::kInternal, "not planned");
  int status = 0;  // the status the error's code implies, unless Route says otherwise
  try {
    plan = Route(request, &status);
  } catch (const std::exception& e) {  // a JSON access the checks above missed: the client's fault
    plan = Error(Code::kInvalidArgument, "the request body could not be read: {}", e.what());
  }
  if (!plan.ok()) return Refusal(request, plan.status(), keep_alive, status);
  return std::move(*plan);
}

Plan Refusal(const http::Request& request, const Status& why, bool keep_alive, int status) {
  Plan refused;
  refused.code = why.code();
  if (request.path.rfind("/api/", 0) == 0) {
    // Ollama's clients read errors as {"error": "..."}.
    refused.immediate = OllamaErrorResponse(why, keep_alive, status);
  } else if (request.path == "/v1/chat/completions" || request.path == "/v1/completions" ||
             request.path == "/v1/embeddings" || request.path == "/v1/models") {
    // OpenAI's clients read errors as {"error": {"message", ...}}.
    refused.immediate = OpenAiErrorResponse(why, keep_alive, status);
  } else if (request.path.rfind("/v2/", 0) == 0) {
    // The v2 protocol's clients read errors as {"error": "..."}.
    refused.immediate = KserveErrorResponse(why, keep_alive, status);
  } else {
    return Refuse(why, keep_alive, status);
  }
  return refused;
}

std::string RenderReply(const Plan& plan, const v1::Envelope& reply, bool keep_alive) {
  try {
    return Render(plan, reply, keep_alive);
  } catch (const std::exception& e) {
    return http::ErrorResponse(Error(Code::kInternal, "the reply could not be written: {}", e.what()), keep_alive);
  }
}

namespace {

std::string Render(const Plan& plan, const v1::Envelope& reply, bool keep_alive) {
  if (plan.kind == Kind::kInferTensors) return InferTensorsResponse(plan.model, plan.tensors_id, reply, keep_alive);
  if (plan.kind == Kind::kModelMetadata) return ModelMetadataResponse(plan.model, reply, keep_alive);
  if (plan.openai) return OpenAiResponse(*plan.openai, reply, keep_alive);
  if (plan.ollama) return OllamaResponse(*plan.ollama, reply, keep_alive);
  if (plan.kind == Kind::kModels) return OpenAiModelsResponse(reply, keep_alive);
  if (reply.has_error()) return http::ErrorResponse(ipc::StatusFromError(reply.error()), keep_alive);
  switch (plan.kind) {
    case Kind::kMetrics: break;  // never sent to the daemon
    case Kind::kInferTensors:
    case Kind::kModelMetadata: break;  // rendered above, errors included
    case Kind::kModels: break;  // rendered above: OpenAI's list
    case Kind::kPs: return JsonResponse(replyjson::PsJson(reply.ps_reply()), keep_alive);
    case Kind::kStatus: return JsonResponse(replyjson::StatusJson(reply.status_reply()), keep_alive);
    case Kind::kLoad: {
      return JsonResponse(replyjson::LoadJson(reply.load_reply()), keep_alive);
    }
    case Kind::kUnload: return JsonResponse({{"model", reply.unload_reply().model()}}, keep_alive);
    case Kind::kPin:
      return JsonResponse({{"model", reply.pin_reply().model()}, {"pinned", reply.pin_reply().pinned()}}, keep_alive);
    case Kind::kRegister: {
      const v1::RegisterReply& r = reply.register_model_reply();
      return JsonResponse({{"model", r.model()}, {"path", r.path()}, {"weight_bytes", r.weight_bytes()},
                           {"removed", r.removed()}, {"replaced", r.replaced()}}, keep_alive);
    }
    case Kind::kFaultArm: return JsonResponse({{"id", reply.fault_arm_reply().id()}}, keep_alive);
    case Kind::kFaultClear: return JsonResponse({{"cleared", reply.fault_clear_reply().cleared()}}, keep_alive);
    case Kind::kGenerate: return http::Response(200, kJson, GenerateReplyJson(reply.generate_reply()), keep_alive);
    case Kind::kEmbed: return JsonResponse(replyjson::EmbedReplyJson(reply.embed_reply()), keep_alive);
    case Kind::kInfer: {
      const v1::InferReply& r = reply.infer_reply();
      if (plan.binary_output) {
        http::Headers headers = {{"X-Warmpool-Rows", std::to_string(r.output().rows())},
                                 {"X-Warmpool-Cols", std::to_string(r.output().cols())},
                                 {"X-Warmpool-Batch-Rows", std::to_string(r.batch_rows())}};
        return http::Response(200, kBinary, r.output().data(), keep_alive, headers);
      }
      Result<client::Matrix> m = client::FromTensor(r.output());
      if (!m.ok()) return http::ErrorResponse(m.status(), keep_alive);
      return JsonResponse({{"output", replyjson::MatrixJson(*m)}, {"batch_rows", r.batch_rows()}}, keep_alive);
    }
  }
  return http::ErrorResponse(Error(Code::kInternal, "no rendering for this reply"), keep_alive);
}

}  // namespace

const char* StreamType(const Plan& plan) { return plan.openai ? "text/event-stream" : "application/x-ndjson"; }

std::string StreamChunk(Plan& plan, const v1::GenerateChunk& chunk) {
  if (plan.openai) return OpenAiStreamEvent(*plan.openai, chunk);
  if (plan.ollama) return OllamaStreamLine(*plan.ollama, chunk);
  return GenerateChunkLine(chunk);
}

std::string StreamEnd(const Plan& plan, const v1::Envelope& reply) {
  if (plan.openai) return OpenAiStreamEnd(*plan.openai, reply);
  if (plan.ollama) return OllamaStreamEnd(*plan.ollama, reply);
  return GenerateFinalLine(reply);
}

std::string ProgressLine(const std::string& model, const v1::StatusReply& status) {
  for (const v1::PsEntry& e : status.loading()) {
    if (e.name() != model) continue;
    return Dump({{"model", model}, {"loaded_bytes", e.loaded_bytes()}, {"weight_bytes", e.weight_bytes()}});
  }
  return "";
}

std::string FinalLoadLine(const v1::Envelope& reply) {
  if (reply.has_error()) {
    Status s = ipc::StatusFromError(reply.error());
    return Dump({{"error", s.ToString()}, {"code", v1::Code_Name(reply.error().code())}});
  }
  json done = replyjson::LoadJson(reply.load_reply());
  done["done"] = true;
  return Dump(done);
}

}  // namespace warmpool::supervisor::httpapi
