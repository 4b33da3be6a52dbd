// POST /v2/models/NAME/infer on the HTTP API: typed tensors in the JSON of KServe's Open Inference
// Protocol (v2), which Triton's and KServe's clients send, as an infer request with inputs; the
// outputs written back in the same shape, and errors as that protocol's {"error": "..."}.
// Pure translation, as supervisor/http_api.h.
//
//   {"id": "7", "inputs": [{"name": "input_ids", "shape": [3], "datatype": "INT64", "data": [1, 2, 3]}],
//    "parameters": {"deadline_ms": 1000, "keep_alive": "5m"}}
//   -> {"model_name": "NAME", "id": "7", "outputs": [{"name": "logits", "shape": [...], "datatype": "FP32",
//       "data": [...]}]}
#pragma once

#include <optional>
#include <string>

#include "common/status.h"
#include "http/request_parser.h"
#include "ipc/warmpool.pb.h"

namespace warmpool::supervisor::httpapi {

// The body's fields: inputs, id (a string, echoed), parameters (deadline_ms, keep_alive). Any other
// key is INVALID_ARGUMENT.
Status FillInferTensors(const http::Request& request, const std::string& model, v1::InferRequest* out,
                        std::optional<std::string>* id);
// The response to the reply (or to its error, as {"error": "CODE: message"}).
std::string InferTensorsResponse(const std::string& model, const std::optional<std::string>& id,
                                 const v1::Envelope& reply, bool keep_alive);
// GET /v2/models/NAME: the model's metadata as that protocol gives it, from a models reply:
// {"name", "versions": [], "platform": "warmpool-ENGINE", "inputs", "outputs"} (inputs and outputs
// are known once a worker has opened the model: empty before, and for an engine that takes any).
std::string ModelMetadataResponse(const std::string& model, const v1::Envelope& reply, bool keep_alive);
// An error in that protocol's shape, with the status its code implies (or `status`).
std::string KserveErrorResponse(const Status& error, bool keep_alive, int status = 0);

}  // namespace warmpool::supervisor::httpapi
