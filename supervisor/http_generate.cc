#include "supervisor/http_generate.h"

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

#include "ipc/error_proto.h"
#include "replyjson/reply_json.h"
#include "supervisor/http_api_body.h"

namespace warmpool::supervisor::httpapi {

using nlohmann::json;

namespace {

std::string Line(const json& doc) { return doc.dump(-1, ' ', false, json::error_handler_t::replace) + "\n"; }

// A number where the body has one; NaN and infinities cannot be written in JSON, so the daemon's
// own range checks see every value a client can send.
Result<std::optional<double>> Number(const json& body, const char* key) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::optional<double>();
  if (!it->is_number()) return Error(Code::kInvalidArgument, "\"{}\" must be a number", key);
  return std::optional<double>(it->get<double>());
}

}  // namespace

Status FillGenerate(const http::Request& request, const std::string& model, v1::GenerateRequest* g) {
  Result<json> body = BodyObject(request);
  if (!body.ok()) return body.status();
  const json& doc = *body;
  if (Status s = OnlyKeys(doc,
                          {"prompt", "tokens", "messages", "max_tokens", "temperature", "top_k", "top_p", "min_p",
                           "repetition_penalty", "seed", "stop", "stream", "deadline_ms", "keep_alive", "logprobs",
                           "top_logprobs"},
                          request);
      !s.ok()) {
    return s;
  }
  g->set_model(model);
  Result<std::string> prompt = String(doc, "prompt");
  if (!prompt.ok()) return prompt.status();
  g->set_prompt(*prompt);
  if (auto it = doc.find("tokens"); it != doc.end()) {
    if (!it->is_array()) return Error(Code::kInvalidArgument, "\"tokens\" must be a list of token ids");
    for (const json& t : *it) {
      if (!t.is_number_integer() || t.get<int64_t>() < INT32_MIN || t.get<int64_t>() > INT32_MAX) {
        return Error(Code::kInvalidArgument, "\"tokens\" must be a list of token ids (integers)");
      }
      g->add_tokens(static_cast<int32_t>(t.get<int64_t>()));
    }
  }
  if (auto it = doc.find("messages"); it != doc.end()) {
    if (!it->is_array()) return Error(Code::kInvalidArgument, "\"messages\" must be a list of {{\"role\", \"content\"}}");
    for (const json& m : *it) {
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string() ||
          (m.contains("content") && !m["content"].is_string())) {
        return Error(Code::kInvalidArgument, "\"messages\" must be a list of {{\"role\", \"content\"}} with strings");
      }
      v1::ChatMessage* message = g->add_messages();
      message->set_role(m["role"].get<std::string>());
      if (m.contains("content")) message->set_content(m["content"].get<std::string>());
    }
  }
  for (const char* key : {"max_tokens", "top_k", "deadline_ms", "top_logprobs"}) {
    if (!doc.contains(key)) continue;
    Result<uint32_t> n = Uint(doc, key);
    if (!n.ok()) return n.status();
    if (key == std::string("max_tokens")) g->set_max_tokens(*n);
    else if (key == std::string("top_k")) g->set_top_k(*n);
    else if (key == std::string("top_logprobs")) g->set_top_logprobs(*n);
    else g->set_deadline_ms(*n);
  }
  if (doc.contains("logprobs")) {
    Result<bool> logprobs = Bool(doc, "logprobs");
    if (!logprobs.ok()) return logprobs.status();
    g->set_logprobs(*logprobs);
  }
  struct Option {
    const char* key;
    void (v1::GenerateRequest::*set)(float);
  };
  for (const Option& o : {Option{"temperature", &v1::GenerateRequest::set_temperature},
                          Option{"top_p", &v1::GenerateRequest::set_top_p},
                          Option{"min_p", &v1::GenerateRequest::set_min_p},
                          Option{"repetition_penalty", &v1::GenerateRequest::set_repetition_penalty}}) {
    Result<std::optional<double>> n = Number(doc, o.key);
    if (!n.ok()) return n.status();
    if (*n) (g->*o.set)(static_cast<float>(**n));
  }
  if (auto it = doc.find("seed"); it != doc.end()) {
    if (!it->is_number_unsigned()) return Error(Code::kInvalidArgument, "\"seed\" must be a whole number >= 0");
    g->set_seed(it->get<uint64_t>());
  }
  if (auto it = doc.find("stop"); it != doc.end()) {
    if (it->is_string()) {
      g->add_stop(it->get<std::string>());
    } else if (it->is_array()) {
      for (const json& s : *it) {
        if (!s.is_string()) return Error(Code::kInvalidArgument, "\"stop\" must be a string or a list of strings");
        g->add_stop(s.get<std::string>());
      }
    } else {
      return Error(Code::kInvalidArgument, "\"stop\" must be a string or a list of strings");
    }
  }
  g->set_stream(true);
  if (doc.contains("stream")) {
    Result<bool> stream = Bool(doc, "stream");
    if (!stream.ok()) return stream.status();
    g->set_stream(*stream);
  }
  Result<std::optional<int64_t>> keep = KeepAlive(doc);
  if (!keep.ok()) return keep.status();
  if (*keep) g->set_keep_alive_ms(**keep);
  return OkStatus();
}

Status FillEmbed(const http::Request& request, const std::string& model, v1::EmbedRequest* e) {
  Result<json> body = BodyObject(request);
  if (!body.ok()) return body.status();
  const json& doc = *body;
  if (Status s = OnlyKeys(doc, {"input", "deadline_ms", "keep_alive", "dimensions"}, request); !s.ok()) return s;
  e->set_model(model);
  if (Status s = ReadDimensions(doc, e); !s.ok()) return s;
  auto input = doc.find("input");
  const bool strings = input != doc.end() && (input->is_string() || (input->is_array() && !input->empty() &&
                                                                     std::all_of(input->begin(), input->end(),
                                                                                 [](const json& t) { return t.is_string(); })));
  if (!strings) return Error(Code::kInvalidArgument, "\"input\" must be a string or a list of strings");
  if (input->is_string()) {
    e->add_input(input->get<std::string>());
  } else {
    for (const json& t : *input) e->add_input(t.get<std::string>());
  }
  if (doc.contains("deadline_ms")) {
    Result<uint32_t> n = Uint(doc, "deadline_ms");
    if (!n.ok()) return n.status();
    e->set_deadline_ms(*n);
  }
  Result<std::optional<int64_t>> keep = KeepAlive(doc);
  if (!keep.ok()) return keep.status();
  if (*keep) e->set_keep_alive_ms(**keep);
  return OkStatus();
}

std::string GenerateChunkLine(const v1::GenerateChunk& chunk) { return Line(replyjson::GenerateChunkJson(chunk)); }

std::string GenerateFinalLine(const v1::Envelope& reply) {
  if (reply.has_error()) {
    const Status s = ipc::StatusFromError(reply.error());
    return Line({{"error", s.ToString()}, {"code", v1::Code_Name(reply.error().code())}});
  }
  json done = replyjson::GenerateReplyJson(reply.generate_reply());
  done.erase("text");  // streamed: the text came in the lines
  done.erase("tokens");
  return Line(done);
}

std::string GenerateReplyJson(const v1::GenerateReply& reply) {
  json out = replyjson::GenerateReplyJson(reply);
  out["text"] = reply.text();  // whole: even when empty
  out["tokens"] = std::vector<int32_t>(reply.tokens().begin(), reply.tokens().end());
  return Line(out);
}

}  // namespace warmpool::supervisor::httpapi
