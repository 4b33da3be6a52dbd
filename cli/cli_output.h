// How the warmpool CLI prints replies: aligned tables for people, JSON for scripts.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "client/client.h"
#include "ipc/warmpool.pb.h"
#include "replyjson/reply_json.h"

namespace warmpool::cli {

using replyjson::MatrixFromJson;
using replyjson::MatrixJson;
using replyjson::ModelsJson;
using replyjson::PsJson;
using replyjson::StatusJson;

std::string ModelsTable(const v1::ModelsReply& reply);
std::string PsTable(const v1::PsReply& reply);
std::string StatusText(const v1::StatusReply& reply);
std::string MatrixText(const client::Matrix& m);
// What `warmpool load` did: ready (or already), its replicas (capped, and why), its sizes, the
// models evicted to make room.
std::string LoadText(const v1::LoadReply& reply);

}  // namespace warmpool::cli
