#include "supervisor/http_api_body.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/json_depth.h"
#include "common/units.h"
#include "common/utf8.h"
#include "supervisor/core/request_check.h"

namespace warmpool::supervisor::httpapi {

using nlohmann::json;


// A JSON text of bounded depth; discarded (is_discarded) when it is not valid JSON.
Result<json> ParseJson(std::string_view text) {
  if (JsonNestingDepth(text, kMaxJsonDepth) > kMaxJsonDepth) {
    return Error(Code::kInvalidArgument, "the JSON body nests deeper than {} levels", kMaxJsonDepth);
  }
  return json::parse(text, nullptr, /*allow_exceptions=*/false);
}

// The body as a JSON object; an empty body is an empty object.
Result<json> BodyObject(const http::Request& request) {
  if (request.body.empty()) return json::object();
  Result<json> parsed = ParseJson(request.body);
  if (!parsed.ok()) return parsed.status();
  json doc = std::move(*parsed);
  if (doc.is_discarded() || !doc.is_object()) {
    return Error(Code::kInvalidArgument, "the request body must be a JSON object, e.g. {{}}");
  }
  return doc;
}

// keep_alive: a duration text ("5m", "30s", "-1") or a number of seconds (negative: forever).
Result<std::optional<int64_t>> KeepAlive(const json& body) {
  if (!body.contains("keep_alive") || body["keep_alive"].is_null()) return std::optional<int64_t>();
  const json& v = body["keep_alive"];
  if (v.is_string()) {
    Result<int64_t> ms = ParseDurationMs(v.get<std::string>());
    if (!ms.ok()) return ms.status();
    return std::optional<int64_t>(*ms);
  }
  if (v.is_number()) {
    double s = v.get<double>();
    if (s < 0) return std::optional<int64_t>(-1);
    if (s > 1e12) return Error(Code::kInvalidArgument, "keep_alive {} s is too long", s);
    return std::optional<int64_t>(static_cast<int64_t>(s * 1000));
  }
  return Error(Code::kInvalidArgument, "keep_alive must be a duration such as \"5m\" or a number of seconds");
}

Result<uint32_t> Uint(const json& body, const char* key, uint32_t fallback) {
  if (!body.contains(key) || body[key].is_null()) return fallback;
  const json& v = body[key];
  if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > UINT32_MAX) {
    return Error(Code::kInvalidArgument, "{} must be a non-negative integer", key);
  }
  return static_cast<uint32_t>(v.get<int64_t>());
}

Status ReadDimensions(const json& body, v1::EmbedRequest* e) {
  if (!body.contains("dimensions") || body["dimensions"].is_null()) return OkStatus();
  const json& v = body["dimensions"];
  if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > UINT32_MAX) {
    return Error(Code::kInvalidArgument, "dimensions must be a whole number of at least 1 (leave it out for the whole "
                                         "embedding)");
  }
  e->set_dimensions(static_cast<uint32_t>(v.get<int64_t>()));
  return OkStatus();
}

Result<bool> Bool(const json& body, const char* key) {
  if (!body.contains(key) || body[key].is_null()) return false;
  if (!body[key].is_boolean()) return Error(Code::kInvalidArgument, "{} must be true or false", key);
  return body[key].get<bool>();
}

Result<std::string> String(const json& body, const char* key) {
  if (!body.contains(key) || body[key].is_null()) return std::string();
  if (!body[key].is_string()) return Error(Code::kInvalidArgument, "{} must be a string", key);
  return body[key].get<std::string>();
}

Status OnlyKeys(const json& body, std::initializer_list<std::string_view> known,
                const http::Request& request) {
  for (const auto& [key, value] : body.items()) {
    if (std::find(known.begin(), known.end(), key) != known.end()) continue;
    std::string takes;
    for (std::string_view k : known) takes += fmt::format("{}\"{}\"", takes.empty() ? "" : ", ", k);
    return Error(Code::kInvalidArgument, "unknown key \"{}\" in the body of {} {}: it takes {}",
                 ValidUtf8(key), request.method, request.path, takes.empty() ? std::string("no keys") : takes);
  }
  return OkStatus();
}

Result<std::vector<std::string>> ToolTexts(const json& body, bool type_required) {
  std::vector<std::string> out;
  auto tools = body.find("tools");
  if (tools == body.end() || tools->is_null()) return out;
  if (!tools->is_array() || tools->size() > static_cast<size_t>(kMaxTools)) {
    return Error(Code::kInvalidArgument, "\"tools\" must be a list of at most {} {{\"type\": \"function\", ...}}",
                 kMaxTools);
  }
  for (const json& tool : *tools) {
    const bool typed = tool.is_object() && (tool.contains("type") ? tool["type"] == "function" : !type_required);
    const json* function = typed && tool.contains("function") ? &tool["function"] : nullptr;
    if (function == nullptr || !function->is_object() || !function->contains("name") ||
        !(*function)["name"].is_string() || (*function)["name"].get_ref<const std::string&>().empty()) {
      return Error(Code::kInvalidArgument, "each tool must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}");
    }
    out.push_back(tool.dump(-1, ' ', false, json::error_handler_t::replace));
  }
  return out;
}

}  // namespace warmpool::supervisor::httpapi
