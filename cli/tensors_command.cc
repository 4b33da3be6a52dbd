#include "cli/tensors_command.h"

#include <nlohmann/json.hpp>

#include "replyjson/kserve_json.h"

namespace warmpool::cli {

using nlohmann::json;

Result<std::string> RunInferTensors(client::Client& client, const std::string& model, const std::string& text,
                                    const client::InferOptions& options) {
  const json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) {
    return Error(Code::kInvalidArgument,
                 "the tensors are not valid JSON: {{\"inputs\": [{{\"name\": N, \"shape\": [...], \"datatype\": "
                 "\"FP32\", \"data\": [...]}}]}}");
  }
  if (doc.is_object() && !doc.contains("inputs")) return Error(Code::kInvalidArgument, "the document has no \"inputs\"");
  Result<std::vector<v1::NamedTensor>> inputs = replyjson::TensorsFromKserve(doc.is_object() ? doc["inputs"] : doc);
  if (!inputs.ok()) return inputs.status();
  Result<v1::InferReply> reply = client.InferTensors(model, std::move(*inputs), options);
  if (!reply.ok()) return reply.status();
  json outputs = json::array();
  for (const v1::NamedTensor& t : reply->outputs()) {
    Result<json> one = replyjson::KserveTensor(t);
    if (!one.ok()) return one.status();
    outputs.push_back(std::move(*one));
  }
  return json{{"outputs", std::move(outputs)}}.dump() + "\n";
}

}  // namespace warmpool::cli
