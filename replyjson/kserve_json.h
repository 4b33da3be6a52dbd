// Typed tensors as JSON, in the shape of KServe's Open Inference Protocol (v2), which Triton,
// KServe and their clients speak: {"name": N, "shape": [...], "datatype": "INT64", "data": [...]}.
// Shared by `warmpool infer --tensors` and POST /v2/models/NAME/infer.
//
// data is row-major, flat or nested (nesting is ignored: only the leaves' order counts). FP32, FP16
// and BF16 take finite numbers within the type's range (JSON has no NaN; an output's NaN or
// infinity is written as null); INT32 and INT64 take integers within their range; BYTES takes
// strings, each one element (an output's BYTES element that is not UTF-8 cannot be written as JSON
// and is refused, naming the tensor).
#pragma once

#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "ipc/warmpool.pb.h"

namespace warmpool::replyjson {

Result<v1::NamedTensor> TensorFromKserve(const nlohmann::json& tensor);
// A list of such tensors ({"inputs": [...]}'s value).
Result<std::vector<v1::NamedTensor>> TensorsFromKserve(const nlohmann::json& tensors);
// A tensor as KServe writes one, its data flat.
Result<nlohmann::json> KserveTensor(const v1::NamedTensor& tensor);
// What a model takes or gives, as KServe's model metadata lists it: [{"name", "datatype", "shape"}]
// (-1 for a size a request chooses).
nlohmann::json KserveSpecs(const google::protobuf::RepeatedPtrField<v1::NamedTensor>& tensors);

}  // namespace warmpool::replyjson
