#include "cli/chat_files.h"

#include <fstream>
#include <iterator>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace warmpool::cli {
namespace {

using nlohmann::json;

Result<json> ReadArray(const std::string& path, const char* what) {
  std::ifstream in(path);
  if (!in) return Error(Code::kInvalidArgument, "{} {}: cannot be read", what, path);
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  json parsed = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) return Error(Code::kInvalidArgument, "{} {}: not JSON", what, path);
  if (!parsed.is_array()) return Error(Code::kInvalidArgument, "{} {}: expected a JSON array", what, path);
  return parsed;
}

// A string member of `object`, or "" when absent; an error when present but not a string.
Result<std::string> StringMember(const json& object, const char* key, const std::string& where) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return std::string();
  if (!it->is_string()) return Error(Code::kInvalidArgument, "{}: \"{}\" must be a string", where, key);
  return it->get<std::string>();
}

Status ReadToolCall(const json& call, const std::string& where, v1::ToolCall& out) {
  if (!call.is_object()) return Error(Code::kInvalidArgument, "{}: a tool call must be an object", where);
  // OpenAI's shape keeps the name and arguments under "function"; --json prints them flat.
  const json& body = call.contains("function") ? call["function"] : call;
  if (!body.is_object()) return Error(Code::kInvalidArgument, "{}: \"function\" must be an object", where);
  Result<std::string> id = StringMember(call, "id", where);
  Result<std::string> name = StringMember(body, "name", where);
  if (!id.ok()) return id.status();
  if (!name.ok()) return name.status();
  if (name->empty()) return Error(Code::kInvalidArgument, "{}: a tool call needs a \"name\"", where);
  out.set_id(*id);
  out.set_name(*name);
  auto arguments = body.find("arguments");
  if (arguments == body.end() || arguments->is_null()) {
    out.set_arguments("{}");
  } else if (arguments->is_string()) {
    out.set_arguments(arguments->get<std::string>());  // OpenAI's: the object's JSON text
  } else if (arguments->is_object()) {
    out.set_arguments(arguments->dump());
  } else {
    return Error(Code::kInvalidArgument, "{}: \"arguments\" must be an object or its JSON text", where);
  }
  return OkStatus();
}

}  // namespace

Status ReadTools(const std::string& path, v1::GenerateRequest& request) {
  Result<json> tools = ReadArray(path, "--tools");
  if (!tools.ok()) return tools.status();
  for (size_t i = 0; i < tools->size(); ++i) {
    if (!(*tools)[i].is_object()) return Error(Code::kInvalidArgument, "--tools {}: tool {} is not an object", path, i);
    request.add_tools((*tools)[i].dump());
  }
  return OkStatus();
}

Status ReadMessages(const std::string& path, v1::GenerateRequest& request) {
  Result<json> messages = ReadArray(path, "--messages");
  if (!messages.ok()) return messages.status();
  if (messages->empty()) return Error(Code::kInvalidArgument, "--messages {}: no message", path);
  for (size_t i = 0; i < messages->size(); ++i) {
    const json& m = (*messages)[i];
    const std::string where = fmt::format("--messages {}: message {}", path, i);
    if (!m.is_object()) return Error(Code::kInvalidArgument, "{}: not an object", where);
    v1::ChatMessage* out = request.add_messages();
    for (auto [key, field] : {std::pair{"role", out->mutable_role()}, std::pair{"content", out->mutable_content()},
                              std::pair{"tool_call_id", out->mutable_tool_call_id()},
                              std::pair{"name", out->mutable_name()}}) {
      Result<std::string> value = StringMember(m, key, where);
      if (!value.ok()) return value.status();
      *field = std::move(*value);
    }
    if (out->role().empty()) return Error(Code::kInvalidArgument, "{}: needs a \"role\"", where);
    auto calls = m.find("tool_calls");
    if (calls == m.end() || calls->is_null()) continue;
    if (!calls->is_array()) return Error(Code::kInvalidArgument, "{}: \"tool_calls\" must be an array", where);
    for (const json& call : *calls) {
      if (Status s = ReadToolCall(call, where, *out->add_tool_calls()); !s.ok()) return s;
    }
  }
  return OkStatus();
}

}  // namespace warmpool::cli
