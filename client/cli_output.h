// How the warmpool CLI prints replies: aligned tables for people, JSON for scripts.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "client/client.h"
#include "ipc/warmpool.pb.h"

namespace warmpool::cli {

nlohmann::json ModelsJson(const v1::ModelsReply& reply);
nlohmann::json PsJson(const v1::PsReply& reply);
nlohmann::json StatusJson(const v1::StatusReply& reply);
nlohmann::json MatrixJson(const client::Matrix& m);

std::string ModelsTable(const v1::ModelsReply& reply);
std::string PsTable(const v1::PsReply& reply);
std::string StatusText(const v1::StatusReply& reply);
std::string MatrixText(const client::Matrix& m);

// A list of equal-length rows of numbers -> Matrix; INVALID_ARGUMENT naming what is wrong.
Result<client::Matrix> MatrixFromJson(const std::string& text);

}  // namespace warmpool::cli
