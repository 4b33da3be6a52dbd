// `warmpool infer MODEL --tensors FILE`: typed tensors in the JSON of KServe's v2 protocol
// ({"inputs": [...]}, or the list alone), sent as an infer request's inputs; the outputs printed as
// {"outputs": [...]} in the same shape (replyjson/kserve_json.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "client/client.h"

namespace warmpool::cli {

// `text` is the document; what to print, or the error.
Result<std::string> RunInferTensors(client::Client& client, const std::string& model, const std::string& text,
                                    const client::InferOptions& options);

}  // namespace warmpool::cli
