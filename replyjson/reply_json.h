// The JSON shape of replies and tensors, shared by `warmpool ... --json` and the HTTP API
// (supervisor/http_api.h) so that both print the same documents for the same state.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "client/matrix.h"
#include "common/status.h"
#include "ipc/warmpool.pb.h"

namespace warmpool::replyjson {

nlohmann::json ModelsJson(const v1::ModelsReply& reply);
nlohmann::json PsJson(const v1::PsReply& reply);
nlohmann::json StatusJson(const v1::StatusReply& reply);
// A list of rows, each a list of numbers.
nlohmann::json MatrixJson(const client::Matrix& m);

// A list of equal-length rows of numbers -> Matrix; INVALID_ARGUMENT naming what is wrong.
Result<client::Matrix> MatrixFromJson(const std::string& text);
Result<client::Matrix> MatrixFromJson(const nlohmann::json& doc);

}  // namespace warmpool::replyjson
