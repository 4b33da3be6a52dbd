#include "supervisor/http_openai.h"

#include <atomic>
#include <ctime>

#include <fmt/format.h>
#include <google/protobuf/stubs/strutil.h>
#include <nlohmann/json.hpp>

#include "common/utf8.h"
#include "http/response.h"
#include "ipc/error_proto.h"
#include "replyjson/reply_json.h"
#include "supervisor/http_api_body.h"

namespace warmpool::supervisor::httpapi {

using nlohmann::json;

namespace {

std::string OpenAiText(const json& doc) { return doc.dump(-1, ' ', false, json::error_handler_t::replace); }

// Every call gets an id its chunks repeat: unique within this daemon's life (the time it started
// and a count), as OpenAI's are opaque strings.
std::string NewId(const char* prefix) {
  static const auto kStarted = static_cast<uint64_t>(std::time(nullptr));
  static std::atomic<uint64_t> next{1};
  return fmt::format("{}-{:x}{:06x}", prefix, kStarted, next++);
}

// A number field: absent or null is nullopt (NaN and infinity cannot be written in JSON).
Result<std::optional<double>> OptionalNumber(const json& body, const char* key) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::optional<double>();
  if (!it->is_number()) return Error(Code::kInvalidArgument, "\"{}\" must be a number", key);
  return std::optional<double>(it->get<double>());
}

// Options OpenAI's API has that warmpool does not do: taken at the value that changes nothing,
// refused otherwise, naming them (a client's setting is never dropped unseen).
Status Unsupported(const json& body, const char* key, const json& neutral, const std::string& instead) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null() || *it == neutral) return OkStatus();
  return Error(Code::kInvalidArgument, "\"{}\" is not supported{}", key, instead.empty() ? "" : ": " + instead);
}

// A message's content: a string, or a list of text parts (what the `openai` libraries send for
// multi-part messages); other parts (images, audio) are refused.
Result<std::string> Content(const json& content) {
  if (content.is_null()) return std::string();
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) return Error(Code::kInvalidArgument, "a message's \"content\" must be a string or a list of parts");
  std::string text;
  for (const json& part : content) {
    if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string()) {
      return Error(Code::kInvalidArgument, "a message's content parts must be {{\"type\": \"text\", \"text\": ...}}: "
                                           "this model takes text only");
    }
    text += part["text"].get<std::string>();
  }
  return text;
}

std::string OpenAiFinish(const std::string& reason) {
  return reason == "length" || reason == "tool_calls" ? reason : "stop";
}

// tools: [{"type": "function", "function": {"name", "description", "parameters"}}], passed on as
// given (the chat template renders them); tool_choice "auto" (the default) or "none" (the model is
// not told of them). Forcing a call ("required", a named function) would need constrained
// decoding, which warmpool does not do: refused, never ignored.
Status FillTools(const json& doc, v1::GenerateRequest* g) {
  auto choice = doc.find("tool_choice");
  const bool none = choice != doc.end() && *choice == "none";
  if (choice != doc.end() && !choice->is_null() && *choice != "auto" && !none) {
    return Error(Code::kInvalidArgument, "\"tool_choice\" may be \"auto\" or \"none\": warmpool does not force a call "
                                         "(\"required\", a named function); offer the tools and let the model choose");
  }
  // Several calls in one answer are read as the model writes them; at most one cannot be promised.
  if (auto parallel = doc.find("parallel_tool_calls"); parallel != doc.end() && !parallel->is_null() && *parallel != true) {
    return Error(Code::kInvalidArgument, "\"parallel_tool_calls\" may only be true: the model's calls are all read");
  }
  auto tools = doc.find("tools");
  if (tools == doc.end() || tools->is_null() || none) return OkStatus();  // none: the model is not told of them
  Result<std::vector<std::string>> texts = ToolTexts(doc, /*type_required=*/true);
  if (!texts.ok()) return texts.status();
  for (std::string& t : *texts) g->add_tools(std::move(t));
  return OkStatus();
}

// A message's own tool calls (an assistant's, carried on in the conversation) and a tool's answer.
Status FillToolMessage(const json& m, v1::ChatMessage* message) {
  if (auto calls = m.find("tool_calls"); calls != m.end() && !calls->is_null()) {
    if (!calls->is_array()) return Error(Code::kInvalidArgument, "a message's \"tool_calls\" must be a list");
    for (const json& c : *calls) {
      const json* function = c.is_object() && c.contains("function") && c["function"].is_object() ? &c["function"] : nullptr;
      if (function == nullptr || !function->contains("name") || !(*function)["name"].is_string()) {
        return Error(Code::kInvalidArgument, "each tool call needs a \"function\" with a \"name\"");
      }
      std::string arguments = "{}";
      if (auto a = function->find("arguments"); a != function->end() && !a->is_null()) {
        // OpenAI's are a string of JSON (parsed with the body's depth bound); an object is taken too.
        json parsed = *a;
        if (a->is_string()) {
          Result<json> inner = ParseJson(a->get_ref<const std::string&>());
          if (!inner.ok()) return inner.status();
          parsed = std::move(*inner);
        }
        if (!parsed.is_object()) return Error(Code::kInvalidArgument, "a tool call's \"arguments\" must be a JSON object");
        arguments = OpenAiText(parsed);
      }
      v1::ToolCall* call = message->add_tool_calls();
      call->set_id(c.contains("id") && c["id"].is_string() ? c["id"].get<std::string>() : "");
      call->set_name((*function)["name"].get<std::string>());
      call->set_arguments(std::move(arguments));
    }
  }
  // A tool's answer says which call it answers. (OpenAI's "name" on other roles names a
  // participant, which chat templates do not render: not passed on, so that a plain chat stays one
  // for any engine.)
  for (const auto& [key, set] : {std::pair<const char*, void (v1::ChatMessage::*)(const std::string&)>{
                                     "tool_call_id", &v1::ChatMessage::set_tool_call_id},
                                 {"name", &v1::ChatMessage::set_name}}) {
    auto it = m.find(key);
    if (it == m.end() || it->is_null()) continue;
    if (!it->is_string()) return Error(Code::kInvalidArgument, "a message's \"{}\" must be a string", key);
    if (message->role() == "tool") (message->*set)(it->get<std::string>());
  }
  return OkStatus();
}

json OpenAiToolCalls(const google::protobuf::RepeatedPtrField<v1::ToolCall>& calls, uint32_t first_index, bool indexed) {
  json out = json::array();
  for (const v1::ToolCall& c : calls) {
    json call = {{"id", c.id()}, {"type", "function"}, {"function", {{"name", c.name()}, {"arguments", c.arguments()}}}};
    if (indexed) call["index"] = first_index++;  // a stream's deltas say which call they are
    out.push_back(std::move(call));
  }
  return out;
}

// OpenAI's usage object (prompt_tokens_details.cached_tokens: those found in the prefix cache).
json OpenAiUsage(const v1::GenerateReply& r) {
  return {{"prompt_tokens", r.prompt_tokens()}, {"completion_tokens", r.completion_tokens()},
          {"total_tokens", r.prompt_tokens() + r.completion_tokens()},
          {"prompt_tokens_details", {{"cached_tokens", r.cached_prompt_tokens()}}}};
}

// A token's log-probability as OpenAI writes it: its text (made valid UTF-8) and its bytes.
json LogprobEntry(const v1::TokenLogprob& t) {
  std::vector<int> bytes(t.piece().begin(), t.piece().end());
  for (int& b : bytes) b &= 0xff;
  return {{"token", ValidUtf8(t.piece())}, {"logprob", t.logprob()}, {"bytes", std::move(bytes)}};
}

json ChatLogprobs(const google::protobuf::RepeatedPtrField<v1::TokenLogprobs>& logprobs) {
  json content = json::array();
  for (const v1::TokenLogprobs& l : logprobs) {
    json entry = LogprobEntry(l.chosen());
    entry["top_logprobs"] = json::array();
    for (const v1::TokenLogprob& t : l.top()) entry["top_logprobs"].push_back(LogprobEntry(t));
    content.push_back(std::move(entry));
  }
  return {{"content", std::move(content)}};
}

json OpenAiObject(const OpenAiCall& call, bool chunk) {
  const bool chat = call.endpoint == OpenAiCall::Endpoint::kChat;
  return {{"id", call.id},
          {"object", chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion"},
          {"created", call.created},
          {"model", call.model}};
}

std::string SseEvent(const json& doc) { return "data: " + OpenAiText(doc) + "\n\n"; }

}  // namespace

Status FillOpenAiGenerate(const http::Request& request, OpenAiCall& call, v1::GenerateRequest* g) {
  Result<json> body = BodyObject(request);
  if (!body.ok()) return body.status();
  const json& doc = *body;
  const bool chat = call.endpoint == OpenAiCall::Endpoint::kChat;
  Status known = chat ? OnlyKeys(doc,
                                 {"model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p",
                                  "seed", "stop", "n", "stream", "stream_options", "logprobs", "top_logprobs", "user",
                                  "frequency_penalty", "presence_penalty", "keep_alive", "tools", "tool_choice",
                                  "parallel_tool_calls"},
                                 request)
                      : OnlyKeys(doc,
                                 {"model", "prompt", "max_tokens", "temperature", "top_p", "seed", "stop", "n", "stream",
                                  "stream_options", "user", "frequency_penalty", "presence_penalty", "echo", "logprobs",
                                  "suffix", "best_of", "keep_alive"},
                                 request);
  if (!known.ok()) return known;
  Result<std::string> model = String(doc, "model");
  if (!model.ok()) return model.status();
  if (model->empty()) return Error(Code::kInvalidArgument, "\"model\" names the model to use (see GET /v1/models)");
  call.model = *model;
  call.id = NewId(chat ? "chatcmpl" : "cmpl");
  call.created = static_cast<int64_t>(std::time(nullptr));
  g->set_model(*model);
  for (const auto& [key, neutral, instead] :
       {std::tuple<const char*, json, std::string>{"n", 1, "send one request per completion"},
        {"frequency_penalty", 0, ""},
        {"presence_penalty", 0, ""},
        {"echo", false, ""},
        {"suffix", nullptr, ""},
        {"best_of", 1, ""}}) {
    if (Status s = Unsupported(doc, key, neutral, instead); !s.ok()) return s;
  }
  if (chat) {
    auto messages = doc.find("messages");
    if (messages == doc.end() || !messages->is_array() || messages->empty()) {
      return Error(Code::kInvalidArgument, "\"messages\" must be a non-empty list of {{\"role\", \"content\"}}");
    }
    for (const json& m : *messages) {
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
        return Error(Code::kInvalidArgument, "each message needs a \"role\" (a string) and a \"content\"");
      }
      Result<std::string> content = Content(m.contains("content") ? m["content"] : json(nullptr));
      if (!content.ok()) return content.status();
      v1::ChatMessage* message = g->add_messages();
      message->set_role(m["role"].get<std::string>());
      message->set_content(*content);
      if (Status s = FillToolMessage(m, message); !s.ok()) return s;
    }
    if (Status s = FillTools(doc, g); !s.ok()) return s;
  } else {
    auto prompt = doc.find("prompt");
    if (prompt != doc.end() && prompt->is_array() && prompt->size() == 1 && (*prompt)[0].is_string()) {
      g->set_prompt((*prompt)[0].get<std::string>());
    } else if (prompt != doc.end() && prompt->is_string()) {
      g->set_prompt(prompt->get<std::string>());
    } else {
      return Error(Code::kInvalidArgument, "\"prompt\" must be a string (one prompt per request)");
    }
    if (Status s = Unsupported(doc, "logprobs", nullptr, "ask /v1/chat/completions for logprobs"); !s.ok()) return s;
  }
  // Chat completions go on until an end token by default; completions stop at 16 tokens, as
  // OpenAI's do.
  g->set_max_tokens(chat ? 0 : 16);
  for (const char* key : {"max_tokens", "max_completion_tokens"}) {
    if (!doc.contains(key) || doc[key].is_null()) continue;
    Result<uint32_t> n = Uint(doc, key);
    if (!n.ok()) return n.status();
    g->set_max_tokens(*n);
  }
  Result<std::optional<double>> temperature = OptionalNumber(doc, "temperature"), top_p = OptionalNumber(doc, "top_p");
  if (!temperature.ok()) return temperature.status();
  if (!top_p.ok()) return top_p.status();
  if (*temperature) g->set_temperature(static_cast<float>(**temperature));
  if (*top_p) g->set_top_p(static_cast<float>(**top_p));
  if (auto it = doc.find("seed"); it != doc.end() && !it->is_null()) {
    if (!it->is_number_integer()) return Error(Code::kInvalidArgument, "\"seed\" must be an integer");
    g->set_seed(it->is_number_unsigned() ? it->get<uint64_t>() : static_cast<uint64_t>(it->get<int64_t>()));
  }
  if (auto it = doc.find("stop"); it != doc.end() && !it->is_null()) {
    if (it->is_string()) {
      g->add_stop(it->get<std::string>());
    } else if (it->is_array() && std::all_of(it->begin(), it->end(), [](const json& s) { return s.is_string(); })) {
      for (const json& s : *it) g->add_stop(s.get<std::string>());
    } else {
      return Error(Code::kInvalidArgument, "\"stop\" must be a string or a list of strings");
    }
  }
  if (chat) {
    Result<bool> logprobs = Bool(doc, "logprobs");
    if (!logprobs.ok()) return logprobs.status();
    call.logprobs = *logprobs;
    g->set_logprobs(*logprobs);
    if (doc.contains("top_logprobs") && !doc["top_logprobs"].is_null()) {
      Result<uint32_t> top = Uint(doc, "top_logprobs");
      if (!top.ok()) return top.status();
      g->set_top_logprobs(*top);
    }
  }
  Result<bool> stream = Bool(doc, "stream");
  if (!stream.ok()) return stream.status();
  call.stream = *stream;
  g->set_stream(*stream);
  if (auto it = doc.find("stream_options"); it != doc.end() && !it->is_null()) {
    if (!it->is_object()) return Error(Code::kInvalidArgument, "\"stream_options\" must be an object");
    Result<bool> usage = Bool(*it, "include_usage");
    if (!usage.ok()) return usage.status();
    call.include_usage = *usage;
  }
  Result<std::optional<int64_t>> keep = KeepAlive(doc);
  if (!keep.ok()) return keep.status();
  if (*keep) g->set_keep_alive_ms(**keep);
  return OkStatus();
}

Status FillOpenAiEmbed(const http::Request& request, OpenAiCall& call, v1::EmbedRequest* e) {
  Result<json> body = BodyObject(request);
  if (!body.ok()) return body.status();
  const json& doc = *body;
  if (Status s = OnlyKeys(doc, {"model", "input", "encoding_format", "dimensions", "user", "keep_alive"}, request);
      !s.ok()) {
    return s;
  }
  Result<std::string> model = String(doc, "model");
  if (!model.ok()) return model.status();
  if (model->empty()) return Error(Code::kInvalidArgument, "\"model\" names the model to use (see GET /v1/models)");
  call.model = *model;
  e->set_model(*model);
  auto input = doc.find("input");
  if (input != doc.end() && input->is_string()) {
    e->add_input(input->get<std::string>());
  } else if (input != doc.end() && input->is_array() && !input->empty() &&
             std::all_of(input->begin(), input->end(), [](const json& t) { return t.is_string(); })) {
    for (const json& t : *input) e->add_input(t.get<std::string>());
  } else {
    return Error(Code::kInvalidArgument, "\"input\" must be a string or a list of strings (token ids are not taken)");
  }
  // base64 (the `openai` libraries' default): the floats' little-endian bytes; else a list.
  Result<std::string> format = String(doc, "encoding_format");
  if (!format.ok()) return format.status();
  if (!format->empty() && *format != "float" && *format != "base64") {
    return Error(Code::kInvalidArgument, "\"encoding_format\" must be \"float\" or \"base64\"");
  }
  call.base64 = *format == "base64";
  if (Status s = ReadDimensions(doc, e); !s.ok()) return s;
  Result<std::optional<int64_t>> keep = KeepAlive(doc);
  if (!keep.ok()) return keep.status();
  if (*keep) e->set_keep_alive_ms(**keep);
  return OkStatus();
}

std::string OpenAiErrorResponse(const Status& error, bool keep_alive, int status) {
  const char* type = error.code() == Code::kInvalidArgument || error.code() == Code::kNotFound ||
                             error.code() == Code::kFailedPrecondition
                         ? "invalid_request_error"
                     : error.code() == Code::kPermissionDenied ? "permission_error"
                     : error.code() == Code::kResourceExhausted ? "rate_limit_error"
                                                                : "server_error";
  const json doc = {{"error",
                     {{"message", error.message()},
                      {"type", type},
                      {"param", nullptr},
                      {"code", error.code() == Code::kNotFound ? json("model_not_found") : json(CodeName(error.code()))}}}};
  return http::Response(status != 0 ? status : http::StatusFor(error.code()), "application/json", OpenAiText(doc) + "\n", keep_alive);
}

std::string OpenAiModelsResponse(const v1::Envelope& reply, bool keep_alive) {
  if (reply.has_error()) return OpenAiErrorResponse(ipc::StatusFromError(reply.error()), keep_alive);
  json data = json::array();
  for (json m : replyjson::ModelsJson(reply.models_reply())) {
    json entry = {{"id", m["name"]}, {"object", "model"}, {"created", 0}, {"owned_by", "warmpool"}};
    entry.update(m);  // warmpool's own fields beside OpenAI's
    data.push_back(std::move(entry));
  }
  return http::Response(200, "application/json", OpenAiText({{"object", "list"}, {"data", std::move(data)}}) + "\n", keep_alive);
}

std::string OpenAiResponse(const OpenAiCall& call, const v1::Envelope& reply, bool keep_alive) {
  if (reply.has_error()) return OpenAiErrorResponse(ipc::StatusFromError(reply.error()), keep_alive);
  if (call.endpoint == OpenAiCall::Endpoint::kEmbeddings) {
    const v1::EmbedReply& r = reply.embed_reply();
    json data = json::array();
    for (int i = 0; i < r.embeddings_size(); i++) {
      const auto& values = r.embeddings(i).values();
      json vector;
      if (call.base64) {
        std::string encoded;
        google::protobuf::Base64Escape(
            google::protobuf::StringPiece(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float)),
            &encoded);
        vector = std::move(encoded);
      } else {
        vector = std::vector<float>(values.begin(), values.end());
      }
      data.push_back({{"object", "embedding"}, {"index", i}, {"embedding", std::move(vector)}});
    }
    const json doc = {{"object", "list"},
                      {"data", std::move(data)},
                      {"model", call.model},
                      {"usage", {{"prompt_tokens", r.prompt_tokens()}, {"total_tokens", r.prompt_tokens()}}}};
    return http::Response(200, "application/json", OpenAiText(doc) + "\n", keep_alive);
  }
  const v1::GenerateReply& r = reply.generate_reply();
  json choice = {{"index", 0}, {"finish_reason", OpenAiFinish(r.finish_reason())}, {"logprobs", nullptr}};
  if (call.endpoint == OpenAiCall::Endpoint::kChat) {
    choice["message"] = {{"role", "assistant"}, {"content", r.text()}};
    if (r.tool_calls_size() > 0) {
      // As OpenAI answers a call: the calls, and content null unless the model also wrote text.
      choice["message"]["tool_calls"] = OpenAiToolCalls(r.tool_calls(), 0, false);
      if (r.text().empty()) choice["message"]["content"] = nullptr;
    }
    if (call.logprobs) choice["logprobs"] = ChatLogprobs(r.logprobs());
  } else {
    choice["text"] = r.text();
  }
  json doc = OpenAiObject(call, false);
  doc["choices"] = json::array({std::move(choice)});
  doc["usage"] = OpenAiUsage(r);
  return http::Response(200, "application/json", OpenAiText(doc) + "\n", keep_alive);
}

std::string OpenAiStreamEvent(OpenAiCall& call, const v1::GenerateChunk& chunk) {
  json choice = {{"index", 0}, {"finish_reason", nullptr}, {"logprobs", nullptr}};
  if (call.endpoint == OpenAiCall::Endpoint::kChat) {
    choice["delta"] = {{"content", chunk.text()}};
    if (chunk.tool_calls_size() > 0) {
      // Each call whole in one delta (its name and all its arguments): clients that gather
      // deltas by index read it as they read OpenAI's pieces.
      choice["delta"]["tool_calls"] = OpenAiToolCalls(chunk.tool_calls(), call.tool_calls_streamed, true);
      call.tool_calls_streamed += static_cast<uint32_t>(chunk.tool_calls_size());
      if (chunk.text().empty()) choice["delta"]["content"] = nullptr;
    }
    if (chunk.index() == 0) choice["delta"]["role"] = "assistant";  // the first says who speaks
    if (call.logprobs) choice["logprobs"] = ChatLogprobs(chunk.logprobs());
  } else {
    choice["text"] = chunk.text();
  }
  json doc = OpenAiObject(call, true);
  doc["choices"] = json::array({std::move(choice)});
  return SseEvent(doc);
}

std::string OpenAiStreamEnd(const OpenAiCall& call, const v1::Envelope& reply) {
  if (reply.has_error()) {
    // After chunks went out the status is sent: the error goes as an event, as OpenAI's do.
    const Status s = ipc::StatusFromError(reply.error());
    return SseEvent({{"error", {{"message", s.message()}, {"type", "server_error"}, {"param", nullptr},
                             {"code", CodeName(s.code())}}}});
  }
  const v1::GenerateReply& r = reply.generate_reply();
  json choice = {{"index", 0}, {"finish_reason", OpenAiFinish(r.finish_reason())}, {"logprobs", nullptr}};
  if (call.endpoint == OpenAiCall::Endpoint::kChat) {
    choice["delta"] = json::object();
  } else {
    choice["text"] = "";
  }
  json last = OpenAiObject(call, true);
  last["choices"] = json::array({std::move(choice)});
  std::string out = SseEvent(last);
  if (call.include_usage) {
    json usage = OpenAiObject(call, true);
    usage["choices"] = json::array();
    usage["usage"] = OpenAiUsage(r);
    out += SseEvent(usage);
  }
  return out + "data: [DONE]\n\n";
}

}  // namespace warmpool::supervisor::httpapi
