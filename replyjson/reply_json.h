// The JSON shape of replies and tensors, shared by `warmpool ... --json` and the HTTP API
// (supervisor/http_api.h) so that both print the same documents for the same state.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "client/matrix.h"
#include "common/status.h"
#include "ipc/warmpool.pb.h"

namespace warmpool::replyjson {

// Sizes have the same names in every document: weight_bytes, workspace_bytes (every replica's
// workspace), total_bytes (their sum: what the model holds of its device's budget). `bytes` stays
// for clients written before these names; it means what it meant (models: weights, ps: total,
// load: weights).
nlohmann::json ModelsJson(const v1::ModelsReply& reply);
nlohmann::json PsJson(const v1::PsReply& reply);
nlohmann::json StatusJson(const v1::StatusReply& reply);
// POST /v1/models/NAME/load: what the load did (replicas added or capped, models evicted).
nlohmann::json LoadJson(const v1::LoadReply& reply);
// A generation: one chunk ({"index", "text", "tokens"}), and the final reply ({"done": true,
// "finish_reason", token counts, times, "chunks"; and "text", "tokens" when it holds them) — the
// lines of `warmpool generate --json` and of the HTTP API's NDJSON stream.
nlohmann::json GenerateChunkJson(const v1::GenerateChunk& chunk);
nlohmann::json GenerateReplyJson(const v1::GenerateReply& reply);
// [{"token", "logprob", "bytes": [...], "top": [{"token", "logprob", "bytes"}, ...]}, ...]
nlohmann::json LogprobsJson(const google::protobuf::RepeatedPtrField<v1::TokenLogprobs>& logprobs);
// A generation's tool calls: [{"id", "name", "arguments": {...}}].
nlohmann::json ToolCallsJson(const google::protobuf::RepeatedPtrField<v1::ToolCall>& calls);
// {"embeddings": [[...], ...], "dimensions", "prompt_tokens", "tokens": [per input], "embed_us"}
nlohmann::json EmbedReplyJson(const v1::EmbedReply& reply);
// A list of rows, each a list of numbers.
nlohmann::json MatrixJson(const client::Matrix& m);

// A list of equal-length rows of numbers -> Matrix; INVALID_ARGUMENT naming what is wrong.
Result<client::Matrix> MatrixFromJson(const std::string& text);
Result<client::Matrix> MatrixFromJson(const nlohmann::json& doc);

}  // namespace warmpool::replyjson
