#include "supervisor/http_tensors.h"

#include <nlohmann/json.hpp>

#include "http/response.h"
#include "ipc/error_proto.h"
#include "replyjson/kserve_json.h"
#include "supervisor/http_api.h"
#include "supervisor/http_api_body.h"

namespace warmpool::supervisor::httpapi {

using nlohmann::json;

Status FillInferTensors(const http::Request& request, const std::string& model, v1::InferRequest* out,
                        std::optional<std::string>* id) {
  Result<json> body = BodyObject(request);
  if (!body.ok()) return body.status();
  if (Status s = OnlyKeys(*body, {"id", "inputs", "parameters"}, request); !s.ok()) return s;
  out->set_model(model);
  if (body->contains("id")) {
    if (!(*body)["id"].is_string()) return Error(Code::kInvalidArgument, "\"id\" must be a string");
    *id = (*body)["id"].get<std::string>();
  }
  if (!body->contains("inputs")) {
    return Error(Code::kInvalidArgument,
                 "the body has no \"inputs\": [{{\"name\", \"shape\", \"datatype\", \"data\"}}, ...]");
  }
  Result<std::vector<v1::NamedTensor>> inputs = replyjson::TensorsFromKserve((*body)["inputs"]);
  if (!inputs.ok()) return inputs.status();
  for (v1::NamedTensor& t : *inputs) *out->add_inputs() = std::move(t);
  if (body->contains("parameters")) {
    const json& parameters = (*body)["parameters"];
    if (!parameters.is_object()) return Error(Code::kInvalidArgument, "\"parameters\" must be an object");
    if (Status s = OnlyKeys(parameters, {"deadline_ms", "keep_alive"}, request); !s.ok()) return s;
    Result<uint32_t> deadline = Uint(parameters, "deadline_ms");
    if (!deadline.ok()) return deadline.status();
    out->set_deadline_ms(*deadline);
    Result<std::optional<int64_t>> keep = KeepAlive(parameters);
    if (!keep.ok()) return keep.status();
    if (*keep) out->set_keep_alive_ms(**keep);
  }
  return OkStatus();
}

std::string KserveErrorResponse(const Status& error, bool keep_alive, int status) {
  return http::Response(status != 0 ? status : http::StatusFor(error.code()), "application/json",
                        json{{"error", error.ToString()}}.dump(-1, ' ', false, json::error_handler_t::replace) + "\n",
                        keep_alive);
}

std::string ModelMetadataResponse(const std::string& model, const v1::Envelope& reply, bool keep_alive) {
  if (reply.has_error()) return KserveErrorResponse(ipc::StatusFromError(reply.error()), keep_alive);
  for (const v1::ModelInfo& m : reply.models_reply().models()) {
    if (m.name() != model) continue;
    const json doc = {{"name", m.name()},
                      {"versions", json::array()},
                      {"platform", "warmpool-" + m.engine()},
                      {"state", m.state()},
                      {"inputs", replyjson::KserveSpecs(m.inputs())},
                      {"outputs", replyjson::KserveSpecs(m.outputs())}};
    return http::Response(200, "application/json",
                          doc.dump(-1, ' ', false, json::error_handler_t::replace) + "\n", keep_alive);
  }
  return KserveErrorResponse(Error(Code::kNotFound, "model \"{}\" is not registered (see GET /v1/models)", model),
                             keep_alive);
}

std::string InferTensorsResponse(const std::string& model, const std::optional<std::string>& id,
                                 const v1::Envelope& reply, bool keep_alive) {
  if (reply.has_error()) return KserveErrorResponse(ipc::StatusFromError(reply.error()), keep_alive);
  json outputs = json::array();
  for (const v1::NamedTensor& t : reply.infer_reply().outputs()) {
    Result<json> one = replyjson::KserveTensor(t);
    if (!one.ok()) return KserveErrorResponse(one.status(), keep_alive);
    outputs.push_back(std::move(*one));
  }
  json doc = {{"model_name", model}};
  if (id) doc["id"] = *id;
  doc["outputs"] = std::move(outputs);
  return http::Response(200, "application/json", doc.dump(-1, ' ', false, json::error_handler_t::replace) + "\n",
                        keep_alive);
}

Result<Plan> PlanTensors(const http::Request& request, const MethodCheck& only) {
  constexpr std::string_view kV2Models = "/v2/models/";
  const std::string& path = request.path;
  Plan plan;
  const std::string rest = path.substr(kV2Models.size());
  const size_t slash = rest.find('/');
  if (!rest.empty() && slash == std::string::npos) {
    if (Status s = only("GET"); !s.ok()) return s;
    plan.kind = Kind::kModelMetadata;
    plan.model = rest;
    plan.request.mutable_models();
    return plan;
  }
  if (slash == 0 || slash == std::string::npos || rest.substr(slash) != "/infer") {
    return Error(Code::kNotFound, "no endpoint {}: POST /v2/models/NAME/infer, GET /v2/models/NAME", path);
  }
  if (Status s = only("POST"); !s.ok()) return s;
  plan.kind = Kind::kInferTensors;
  plan.model = rest.substr(0, slash);
  if (Status s = FillInferTensors(request, plan.model, plan.request.mutable_infer(), &plan.tensors_id); !s.ok()) {
    return s;
  }
  return plan;
}

}  // namespace warmpool::supervisor::httpapi
