#include "supervisor/http_ollama.h"

#include <algorithm>
#include <ctime>

#include <fmt/chrono.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/version.h"
#include "http/response.h"
#include "ipc/error_proto.h"
#include "supervisor/http_api.h"
#include "supervisor/http_api_body.h"

namespace warmpool::supervisor::httpapi {

using nlohmann::json;

namespace {

std::string OllamaText(const json& doc) { return doc.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string IsoTime(std::time_t t) {
  std::tm utc{};
  gmtime_r(&t, &utc);
  return fmt::format("{:%Y-%m-%dT%H:%M:%SZ}", utc);
}
std::string Now() { return IsoTime(std::time(nullptr)); }

// Ollama's sampling options onto the request's; the runner's own tuning (context size, threads,
// GPU layers, batch) is warmpool's configuration, not a request's, and is taken without effect.
Status OllamaOptions(const json& options, v1::GenerateRequest* g) {
  if (!options.is_object()) return Error(Code::kInvalidArgument, "\"options\" must be an object");
  static const char* const kIgnored[] = {"num_ctx", "num_batch", "num_gpu", "main_gpu", "num_thread", "use_mmap",
                                         "use_mlock", "numa", "low_vram", "num_keep", "f16_kv", "vocab_only"};
  for (const auto& item : options.items()) {
    const std::string key = item.key();
    const json& value = item.value();
    if (value.is_null()) continue;
    const bool ignored = std::find_if(std::begin(kIgnored), std::end(kIgnored),
                                      [&](const char* k) { return key == k; }) != std::end(kIgnored);
    if (ignored) continue;
    if (key == "stop") {
      if (value.is_string()) {
        g->add_stop(value.get<std::string>());
        continue;
      }
      if (!value.is_array()) return Error(Code::kInvalidArgument, "options.stop must be a list of strings");
      for (const json& s : value) {
        if (!s.is_string()) return Error(Code::kInvalidArgument, "options.stop must be a list of strings");
        g->add_stop(s.get<std::string>());
      }
      continue;
    }
    if (!value.is_number()) return Error(Code::kInvalidArgument, "options.{} must be a number", key);
    const double x = value.get<double>();
    if (key == "temperature") g->set_temperature(static_cast<float>(x));
    else if (key == "top_p") g->set_top_p(static_cast<float>(x));
    else if (key == "min_p") g->set_min_p(static_cast<float>(x));
    else if (key == "repeat_penalty") g->set_repetition_penalty(static_cast<float>(x));
    else if (key == "top_k" || key == "seed" || key == "num_predict") {
      if (!value.is_number_integer()) return Error(Code::kInvalidArgument, "options.{} must be an integer", key);
      const int64_t n = value.get<int64_t>();
      if (key == "num_predict") {
        if (n > UINT32_MAX) return Error(Code::kInvalidArgument, "options.num_predict {} is too large", n);
        g->set_max_tokens(n < 0 ? 0 : static_cast<uint32_t>(n));  // -1: until the model ends
      } else if (key == "top_k") {
        if (n < 0 || n > UINT32_MAX) return Error(Code::kInvalidArgument, "options.top_k must be >= 0");
        g->set_top_k(static_cast<uint32_t>(n));
      } else {
        g->set_seed(static_cast<uint64_t>(n));
      }
    } else {
      return Error(Code::kInvalidArgument,
                   "options.{} is not supported (temperature, top_k, top_p, min_p, repeat_penalty, seed, stop, "
                   "num_predict)",
                   key);
    }
  }
  return OkStatus();
}

// keep_alive as Ollama takes it: negative means forever (warmpool's -1).
Result<std::optional<int64_t>> OllamaKeepAlive(const json& body) {
  Result<std::optional<int64_t>> keep = KeepAlive(body);
  if (keep.ok() && *keep && **keep < 0) return std::optional<int64_t>(-1);
  if (!keep.ok()) {
    // Ollama writes "forever" as a negative duration ("-1m"): forever here too.
    auto it = body.find("keep_alive");
    if (it != body.end() && it->is_string() && it->get<std::string>().rfind('-', 0) == 0) {
      return std::optional<int64_t>(-1);
    }
  }
  return keep;
}

json OllamaStats(const v1::GenerateReply& r) {
  return {{"total_duration", r.generate_us() * 1000},
          {"load_duration", 0},
          {"prompt_eval_count", r.prompt_tokens()},
          {"prompt_eval_duration", r.first_token_us() * 1000},
          {"eval_count", r.completion_tokens()},
          {"eval_duration", (r.generate_us() - std::min(r.generate_us(), r.first_token_us())) * 1000}};
}

using ToolCalls = google::protobuf::RepeatedPtrField<v1::ToolCall>;

json OllamaLine(const OllamaCall& call, const std::string& text, bool done, const ToolCalls* calls = nullptr) {
  json line = {{"model", call.model}, {"created_at", Now()}};
  if (call.endpoint == OllamaCall::Endpoint::kChat) {
    line["message"] = {{"role", "assistant"}, {"content", text}};
    if (calls != nullptr && !calls->empty()) {
      // Ollama's shape: each call's function, its arguments an object.
      json out = json::array();
      for (const v1::ToolCall& c : *calls) {
        json arguments = json::parse(c.arguments(), nullptr, false);
        out.push_back({{"function", {{"name", c.name()}, {"arguments", arguments.is_object() ? arguments : json::object()}}}});
      }
      line["message"]["tool_calls"] = std::move(out);
    }
  } else {
    line["response"] = text;
  }
  line["done"] = done;
  return line;
}

std::string OllamaFinish(const std::string& reason) { return reason == "length" ? "length" : "stop"; }

// tools: as OpenAI's ([{"type": "function", "function": {"name", ...}}]), for the chat template.
Status OllamaTools(const json& doc, v1::GenerateRequest* g) {
  Result<std::vector<std::string>> texts = ToolTexts(doc, /*type_required=*/false);
  if (!texts.ok()) return texts.status();
  for (std::string& t : *texts) g->add_tools(std::move(t));
  return OkStatus();
}

// An assistant's earlier calls ([{"function": {"name", "arguments": {...}}}]) and a tool's answer
// ("tool_name").
Status OllamaToolMessage(const json& m, v1::ChatMessage* message) {
  if (auto calls = m.find("tool_calls"); calls != m.end() && !calls->is_null()) {
    if (!calls->is_array()) return Error(Code::kInvalidArgument, "a message's \"tool_calls\" must be a list");
    for (const json& c : *calls) {
      const json* function = c.is_object() && c.contains("function") && c["function"].is_object() ? &c["function"] : nullptr;
      if (function == nullptr || !function->contains("name") || !(*function)["name"].is_string()) {
        return Error(Code::kInvalidArgument, "each tool call needs a \"function\" with a \"name\"");
      }
      const json arguments = function->contains("arguments") ? (*function)["arguments"] : json::object();
      if (!arguments.is_object()) return Error(Code::kInvalidArgument, "a tool call's \"arguments\" must be an object");
      v1::ToolCall* call = message->add_tool_calls();
      call->set_name((*function)["name"].get<std::string>());
      call->set_arguments(OllamaText(arguments));
    }
  }
  if (message->role() == "tool") {  // a tool's answer names its tool (another role's name is not rendered)
    for (const char* key : {"tool_name", "name"}) {
      if (auto it = m.find(key); it != m.end() && it->is_string()) message->set_name(it->get<std::string>());
    }
  }
  return OkStatus();
}

json OllamaDetails(const v1::ModelInfo& m) {
  return {{"parent_model", ""}, {"format", "safetensors"}, {"family", ""}, {"families", json::array()},
          {"parameter_size", ""}, {"quantization_level", ""}};
}

}  // namespace

std::string OllamaErrorResponse(const Status& error, bool keep_alive, int status) {
  return http::Response(status != 0 ? status : http::StatusFor(error.code()), "application/json",
                        OllamaText({{"error", error.message()}}) + "\n", keep_alive);
}

Status FillOllama(const http::Request& request, OllamaCall& call, v1::Envelope* out) {
  using E = OllamaCall::Endpoint;
  if (call.endpoint == E::kVersion) return OkStatus();
  if (call.endpoint == E::kTags) {
    out->mutable_models();
    return OkStatus();
  }
  if (call.endpoint == E::kPs) {
    out->mutable_ps();
    return OkStatus();
  }
  Result<json> body = BodyObject(request);
  if (!body.ok()) return body.status();
  const json& doc = *body;
  // "name" is the older spelling of "model".
  Result<std::string> model = String(doc, doc.contains("model") ? "model" : "name");
  if (!model.ok()) return model.status();
  if (model->empty()) return Error(Code::kInvalidArgument, "\"model\" names the model (see /api/tags)");
  call.model = *model;
  if (call.endpoint == E::kShow) {
    if (Status s = OnlyKeys(doc, {"model", "name", "verbose"}, request); !s.ok()) return s;
    out->mutable_models();
    return OkStatus();
  }
  Result<std::optional<int64_t>> keep = OllamaKeepAlive(doc);
  if (!keep.ok()) return keep.status();
  if (call.endpoint == E::kEmbed || call.endpoint == E::kEmbeddings) {
    // dimensions: /api/embed's alone (the older /api/embeddings has none), as Ollama reads it: a
    // positive number below the model's size shortens the vectors; 0, less, or the size or more
    // leave them whole.
    const bool embed = call.endpoint == E::kEmbed;
    Status known = embed ? OnlyKeys(doc, {"model", "input", "prompt", "truncate", "options", "keep_alive", "dimensions"},
                                    request)
                         : OnlyKeys(doc, {"model", "input", "prompt", "truncate", "options", "keep_alive"}, request);
    if (!known.ok()) return known;
    v1::EmbedRequest* e = out->mutable_embed();
    e->set_model(*model);
    if (embed && doc.contains("dimensions") && !doc["dimensions"].is_null()) {
      const json& d = doc["dimensions"];
      if (!d.is_number_integer()) return Error(Code::kInvalidArgument, "dimensions must be a whole number");
      if (d.get<int64_t>() > 0) e->set_dimensions(static_cast<uint32_t>(std::min<int64_t>(d.get<int64_t>(), UINT32_MAX)));
      e->set_whole_past_size(true);
    }
    const json* input = doc.contains("input") ? &doc["input"] : doc.contains("prompt") ? &doc["prompt"] : nullptr;
    if (input != nullptr && input->is_string()) {
      e->add_input(input->get<std::string>());
    } else if (input != nullptr && input->is_array() && !input->empty() &&
               std::all_of(input->begin(), input->end(), [](const json& t) { return t.is_string(); })) {
      for (const json& t : *input) e->add_input(t.get<std::string>());
    } else {
      return Error(Code::kInvalidArgument, "\"input\" must be a string or a list of strings");
    }
    if (*keep) e->set_keep_alive_ms(**keep);
    return OkStatus();
  }
  const bool chat = call.endpoint == E::kChat;
  Status known = chat ? OnlyKeys(doc, {"model", "messages", "stream", "options", "keep_alive", "format", "tools", "think"}, request)
                      : OnlyKeys(doc, {"model", "prompt", "stream", "options", "keep_alive", "raw", "format", "system",
                                       "template", "context", "images", "suffix", "think"},
                                 request);
  if (!known.ok()) return known;
  for (const char* key : {"format", "images", "template", "context", "suffix", "system"}) {
    auto it = doc.find(key);
    if (it != doc.end() && !it->is_null() && !(it->is_array() && it->empty()) && !(it->is_string() && it->get<std::string>().empty())) {
      return Error(Code::kInvalidArgument, "\"{}\" is not supported yet", key);
    }
  }
  if (doc.contains("stream")) {
    Result<bool> stream = Bool(doc, "stream");
    if (!stream.ok()) return stream.status();
    call.stream = *stream;
  }
  const bool empty_prompt = !chat && (!doc.contains("prompt") || (doc["prompt"].is_string() && doc["prompt"].get<std::string>().empty()));
  const bool empty_messages = chat && (!doc.contains("messages") || (doc["messages"].is_array() && doc["messages"].empty()));
  if (empty_prompt || empty_messages) {
    // Ollama's way to load a model, or (keep_alive 0) to unload it.
    call.stream = false;
    if (*keep && **keep == 0) {
      call.endpoint = E::kUnload;
      out->mutable_unload()->set_model(*model);
    } else {
      call.endpoint = E::kLoad;
      out->mutable_load()->set_model(*model);
      if (*keep) out->mutable_load()->set_keep_alive_ms(**keep);
    }
    return OkStatus();
  }
  v1::GenerateRequest* g = out->mutable_generate();
  g->set_model(*model);
  if (chat) {
    if (!doc["messages"].is_array()) return Error(Code::kInvalidArgument, "\"messages\" must be a list");
    for (const json& m : doc["messages"]) {
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string() ||
          (m.contains("content") && !m["content"].is_string() && !m["content"].is_null())) {
        return Error(Code::kInvalidArgument, "each message needs a \"role\" and a \"content\" (strings)");
      }
      if (m.contains("images") && !(m["images"].is_null() || (m["images"].is_array() && m["images"].empty()))) {
        return Error(Code::kInvalidArgument, "images are not supported: this model takes text");
      }
      v1::ChatMessage* message = g->add_messages();
      message->set_role(m["role"].get<std::string>());
      if (m.contains("content") && m["content"].is_string()) message->set_content(m["content"].get<std::string>());
      if (Status s = OllamaToolMessage(m, message); !s.ok()) return s;
    }
    if (Status s = OllamaTools(doc, g); !s.ok()) return s;
  } else {
    if (!doc["prompt"].is_string()) return Error(Code::kInvalidArgument, "\"prompt\" must be a string");
    g->set_prompt(doc["prompt"].get<std::string>());
  }
  if (doc.contains("options") && !doc["options"].is_null()) {
    if (Status s = OllamaOptions(doc["options"], g); !s.ok()) return s;
  }
  g->set_stream(call.stream);
  if (*keep) g->set_keep_alive_ms(**keep);
  return OkStatus();
}

std::string OllamaStreamLine(const OllamaCall& call, const v1::GenerateChunk& chunk) {
  return OllamaText(OllamaLine(call, chunk.text(), false, &chunk.tool_calls())) + "\n";
}

std::string OllamaStreamEnd(const OllamaCall& call, const v1::Envelope& reply) {
  if (reply.has_error()) return OllamaText({{"error", ipc::StatusFromError(reply.error()).message()}}) + "\n";
  const v1::GenerateReply& r = reply.generate_reply();
  json last = OllamaLine(call, "", true);
  last["done_reason"] = OllamaFinish(r.finish_reason());
  last.update(OllamaStats(r));
  return OllamaText(last) + "\n";
}

std::string OllamaResponse(const OllamaCall& call, const v1::Envelope& reply, bool keep_alive) {
  using E = OllamaCall::Endpoint;
  if (reply.has_error()) return OllamaErrorResponse(ipc::StatusFromError(reply.error()), keep_alive);
  json doc;
  switch (call.endpoint) {
    case E::kVersion: doc = {{"version", kProjectVersion}}; break;
    case E::kGenerate:
    case E::kChat: {
      const v1::GenerateReply& r = reply.generate_reply();
      doc = OllamaLine(call, r.text(), true, &r.tool_calls());
      doc["done_reason"] = OllamaFinish(r.finish_reason());
      doc.update(OllamaStats(r));
      break;
    }
    case E::kLoad:
    case E::kUnload:
      doc = OllamaLine(call, "", true);
      doc["done_reason"] = call.endpoint == E::kLoad ? "load" : "unload";
      break;
    case E::kEmbed:
    case E::kEmbeddings: {
      const v1::EmbedReply& r = reply.embed_reply();
      json vectors = json::array();
      for (const v1::Embedding& e : r.embeddings()) vectors.push_back(std::vector<float>(e.values().begin(), e.values().end()));
      if (call.endpoint == E::kEmbeddings) {
        doc = {{"embedding", vectors.empty() ? json::array() : vectors[0]}};
      } else {
        doc = {{"model", call.model}, {"embeddings", std::move(vectors)}, {"total_duration", r.embed_us() * 1000},
               {"load_duration", 0}, {"prompt_eval_count", r.prompt_tokens()}};
      }
      break;
    }
    case E::kTags: {
      json models = json::array();
      for (const v1::ModelInfo& m : reply.models_reply().models()) {
        if (m.context() == 0) continue;  // language models only: what Ollama's clients can talk to
        models.push_back({{"name", m.name()}, {"model", m.name()}, {"modified_at", IsoTime(0)},
                          {"size", m.weight_bytes()}, {"digest", ""}, {"details", OllamaDetails(m)}});
      }
      doc = {{"models", std::move(models)}};
      break;
    }
    case E::kPs: {
      json models = json::array();
      for (const v1::PsEntry& e : reply.ps_reply().models()) {
        if (e.context() == 0 || e.state() != "ready") continue;
        const std::time_t expires = e.has_expiry() ? std::time(nullptr) + e.expires_in() : 253402300799;  // 9999
        models.push_back({{"name", e.name()}, {"model", e.name()}, {"size", e.weight_bytes() + e.workspace_bytes()},
                          {"digest", ""}, {"details", OllamaDetails(v1::ModelInfo())}, {"expires_at", IsoTime(expires)},
                          {"size_vram", 0}});
      }
      doc = {{"models", std::move(models)}};
      break;
    }
    case E::kShow: {
      for (const v1::ModelInfo& m : reply.models_reply().models()) {
        if (m.name() != call.model) continue;
        doc = {{"modelfile", ""}, {"parameters", ""}, {"template", ""}, {"details", OllamaDetails(m)},
               {"model_info", {{"warmpool.engine", m.engine()}, {"warmpool.context_length", m.context()},
                               {"warmpool.weight_bytes", m.weight_bytes()}}},
               {"capabilities", m.context() == 0   ? json::array()
                                : m.embeds_only() ? json::array({"embedding"})
                                                  : json::array({"completion", "embedding"})}};
      }
      if (doc.is_null()) {
        return OllamaErrorResponse(Error(Code::kNotFound, "model \"{}\" not found", call.model), keep_alive);
      }
      break;
    }
  }
  return http::Response(200, "application/json", OllamaText(doc) + "\n", keep_alive);
}

Result<Plan> PlanOllama(const http::Request& request, const MethodCheck& only) {
  using E = OllamaCall::Endpoint;
  const std::string& path = request.path;
  static const std::pair<const char*, E> kRoutes[] = {
      {"/api/version", E::kVersion}, {"/api/tags", E::kTags},   {"/api/ps", E::kPs},
      {"/api/show", E::kShow},       {"/api/generate", E::kGenerate}, {"/api/chat", E::kChat},
      {"/api/embed", E::kEmbed},     {"/api/embeddings", E::kEmbeddings}};
  for (const char* registry : {"/api/pull", "/api/push", "/api/create", "/api/copy", "/api/delete", "/api/blobs"}) {
    if (path.rfind(registry, 0) == 0) {
      return Error(Code::kFailedPrecondition,
                   "{} is not available: warmpool serves local model directories; register one (the models "
                   "directory, [[models]], or warmpool register NAME PATH)",
                   path);
    }
  }
  Plan plan;
  OllamaCall call;
  bool found = false;
  for (const auto& [route, endpoint] : kRoutes) {
    if (path == route) {
      call.endpoint = endpoint;
      found = true;
    }
  }
  if (!found) return Error(Code::kNotFound, "no endpoint {}", path);
  const bool read = call.endpoint == E::kVersion || call.endpoint == E::kTags || call.endpoint == E::kPs;
  if (Status s = only(read ? "GET" : "POST"); !s.ok()) return s;
  if (Status s = FillOllama(request, call, &plan.request); !s.ok()) return s;
  switch (call.endpoint) {
    case E::kVersion: plan.immediate = OllamaResponse(call, v1::Envelope(), request.keep_alive); break;
    case E::kGenerate:
    case E::kChat: plan.kind = Kind::kGenerate; plan.stream = call.stream; break;
    case E::kEmbed:
    case E::kEmbeddings: plan.kind = Kind::kEmbed; break;
    case E::kLoad: plan.kind = Kind::kLoad; break;
    case E::kUnload: plan.kind = Kind::kUnload; break;
    case E::kTags:
    case E::kShow: plan.kind = Kind::kModels; break;
    case E::kPs: plan.kind = Kind::kPs; break;
  }
  plan.model = call.model;
  plan.ollama = std::move(call);
  return plan;
}

}  // namespace warmpool::supervisor::httpapi
