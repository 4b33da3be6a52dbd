// The JSON bodies of the HTTP API: parsed with a bounded depth, read field by field with typed
// errors, and refused when they carry a key the endpoint does not take (as an unknown key of the
// configuration file is): a misspelt "keep_alive" must not be silently ignored.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "http/request_parser.h"
#include "ipc/warmpool.pb.h"

namespace warmpool::supervisor::httpapi {

// Deeper documents are refused before they are parsed: copying or walking one recursively would
// take a stack frame per level.
inline constexpr int kMaxJsonDepth = 32;

// A JSON text of bounded depth; discarded (is_discarded) when it is not valid JSON.
Result<nlohmann::json> ParseJson(std::string_view text);
// The body as a JSON object; an empty body is an empty object.
Result<nlohmann::json> BodyObject(const http::Request& request);
// INVALID_ARGUMENT (HTTP 400) naming the first key of `body` that is not in `known`, and what the
// endpoint takes.
Status OnlyKeys(const nlohmann::json& body, std::initializer_list<std::string_view> known,
                const http::Request& request);

// keep_alive: a duration text ("5m", "30s", "-1") or a number of seconds (negative: forever).
Result<std::optional<int64_t>> KeepAlive(const nlohmann::json& body);
Result<uint32_t> Uint(const nlohmann::json& body, const char* key, uint32_t fallback = 0);
Result<bool> Bool(const nlohmann::json& body, const char* key);
// An embedding request's "dimensions" (OpenAI's, the native endpoint's) into
// EmbedRequest.dimensions: absent or null leaves the whole embedding; else a whole number of at
// least 1 (the daemon checks the model's size).
Status ReadDimensions(const nlohmann::json& body, v1::EmbedRequest* e);
Result<std::string> String(const nlohmann::json& body, const char* key);
// A chat's "tools" (absent or null: none), each {"type": "function", "function": {"name", ...}}
// with a name (`type` may be left out where the API allows it), at most kMaxTools of them: each
// as compact JSON, for GenerateRequest.tools.
Result<std::vector<std::string>> ToolTexts(const nlohmann::json& body, bool type_required);

}  // namespace warmpool::supervisor::httpapi
