#include "replyjson/reply_json.h"

#include "replyjson/kserve_json.h"

#include <cmath>
#include <limits>

namespace warmpool::replyjson {

using nlohmann::json;

json ModelsJson(const v1::ModelsReply& reply) {
  json out = json::array();
  for (const v1::ModelInfo& m : reply.models()) {
    json j = {{"name", m.name()}, {"engine", m.engine()}, {"path", m.path()},
              {"state", m.state()}, {"bytes", m.bytes()}};
    j["weight_bytes"] = m.weight_bytes();
    j["workspace_bytes"] = m.workspace_bytes();
    j["total_bytes"] = m.weight_bytes() + m.workspace_bytes();
    j["pinned"] = m.pinned();
    j["file_broken"] = m.file_broken();
    j["in_features"] = m.in_features();
    j["out_features"] = m.out_features();
    j["error"] = m.last_error().empty() ? json(nullptr) : json(m.last_error());
    j["retry_in_ms"] = m.retry_in_ms();
    // Language models that take tools: the format their calls are read in.
    j["tool_call_format"] = m.tool_call_format().empty() ? json(nullptr) : json(m.tool_call_format());
    // Language models: generations a replica runs at once.
    j["parallel"] = m.parallel() == 0 ? json(nullptr) : json(m.parallel());
    j["kv_cache_tokens"] = m.kv_cache_tokens() == 0 ? json(nullptr) : json(m.kv_cache_tokens());
    j["embeds_only"] = m.embeds_only();
    // Typed tensors: null until a worker has opened it and said, or when its engine takes none;
    // inputs and outputs null when it takes any.
    j["tensors"] = nullptr;
    if (m.runs_tensors()) {
      const bool any = m.inputs_size() == 0 && m.outputs_size() == 0;
      j["tensors"] = {{"inputs", any ? json(nullptr) : KserveSpecs(m.inputs())},
                      {"outputs", any ? json(nullptr) : KserveSpecs(m.outputs())}};
    }
    out.push_back(std::move(j));
  }
  return out;
}

json PsJson(const v1::PsReply& reply) {
  json out = json::array();
  for (const v1::PsEntry& e : reply.models()) {
    out.push_back({{"name", e.name()},
                   {"state", e.state()},
                   {"device", e.device()},
                   {"bytes", e.bytes()},
                   {"inflight", e.inflight()},
                   {"replicas", e.replicas()},
                   {"last_used", e.last_used()},
                   {"expires_in", e.has_expiry() ? json(e.expires_in()) : json(nullptr)},
                   {"loaded_bytes", e.loaded_bytes()},
                   {"error", e.last_error().empty() ? json(nullptr) : json(e.last_error())},
                   {"retry_in_ms", e.retry_in_ms()},
                   {"worker", e.worker() < 0 ? json(nullptr) : json(e.worker())},
                   {"weight_bytes", e.weight_bytes()},
                   {"workspace_bytes", e.workspace_bytes()},
                   {"total_bytes", e.weight_bytes() + e.workspace_bytes()},
                   {"pinned", e.pinned()},
                   {"file_broken", e.file_broken()},
                   {"prompt_tokens", e.prompt_tokens()},
                   {"cached_prompt_tokens", e.cached_prompt_tokens()}});
  }
  return out;
}

json StatusJson(const v1::StatusReply& reply) {
  json devices = json::array(), workers = json::array();
  for (const v1::DeviceStatus& d : reply.devices()) {
    devices.push_back({{"id", d.id()}, {"kind", d.kind()}, {"budget_bytes", d.budget_bytes()},
                       {"used_bytes", d.used_bytes()}, {"kept_bytes", d.kept_bytes()},
                       {"kept_regions", d.kept_regions()}, {"name", d.name()}, {"total_bytes", d.total_bytes()}});
  }
  for (const v1::WorkerStatus& w : reply.workers()) {
    json models = json::array();
    for (const std::string& m : w.models()) models.push_back(m);
    workers.push_back({{"slot", w.slot()}, {"pid", w.pid()}, {"device", w.device()},
                       {"state", w.state()}, {"restarts", w.restarts()},
                       {"last_exit", w.last_exit().empty() ? json(nullptr) : json(w.last_exit())},
                       {"models", models}, {"outstanding", w.outstanding()}});
  }
  json loading = json::array();
  for (const v1::PsEntry& e : reply.loading()) {
    loading.push_back({{"name", e.name()}, {"loaded_bytes", e.loaded_bytes()},
                       {"weight_bytes", e.weight_bytes()}});
  }
  json failed = json::array();
  for (const v1::ModelInfo& m : reply.failed()) {
    failed.push_back({{"name", m.name()}, {"error", m.last_error()}, {"retry_in_ms", m.retry_in_ms()},
                      {"file_broken", m.file_broken()}});
  }
  return {{"version", reply.version()}, {"instance", reply.instance()}, {"backend", reply.backend()}, {"devices", devices},
          {"workers", workers}, {"inflight", reply.inflight()}, {"queued", reply.queued()},
          {"failed", failed}, {"fault_injection", reply.fault_injection()}, {"loading", loading}};
}

json LogprobsJson(const google::protobuf::RepeatedPtrField<v1::TokenLogprobs>& logprobs) {
  // A token's bytes may be a piece of a UTF-8 character: a list of numbers, never a JSON string.
  auto one = [](const v1::TokenLogprob& l) {
    return json{{"token", l.token()},
                {"logprob", l.logprob()},
                {"bytes", std::vector<uint8_t>(l.piece().begin(), l.piece().end())}};
  };
  json out = json::array();
  for (const v1::TokenLogprobs& l : logprobs) {
    json entry = one(l.chosen());
    json top = json::array();
    for (const v1::TokenLogprob& t : l.top()) top.push_back(one(t));
    entry["top"] = std::move(top);
    out.push_back(std::move(entry));
  }
  return out;
}

// Tool calls as warmpool's JSON has them: arguments an object (the model's JSON, parsed again).
json ToolCallsJson(const google::protobuf::RepeatedPtrField<v1::ToolCall>& calls) {
  json out = json::array();
  for (const v1::ToolCall& c : calls) {
    json arguments = json::parse(c.arguments(), nullptr, false);
    out.push_back({{"id", c.id()}, {"name", c.name()}, {"arguments", arguments.is_discarded() ? json::object() : arguments}});
  }
  return out;
}

json GenerateChunkJson(const v1::GenerateChunk& chunk) {
  json out = {{"index", chunk.index()},
              {"text", chunk.text()},
              {"tokens", std::vector<int32_t>(chunk.tokens().begin(), chunk.tokens().end())}};
  if (chunk.logprobs_size() > 0) out["logprobs"] = LogprobsJson(chunk.logprobs());
  if (chunk.tool_calls_size() > 0) out["tool_calls"] = ToolCallsJson(chunk.tool_calls());
  return out;
}

json GenerateReplyJson(const v1::GenerateReply& r) {
  json out = {{"done", true},
              {"finish_reason", r.finish_reason()},
              {"prompt_tokens", r.prompt_tokens()},
              {"cached_prompt_tokens", r.cached_prompt_tokens()},
              {"completion_tokens", r.completion_tokens()},
              {"first_token_us", r.first_token_us()},
              {"generate_us", r.generate_us()},
              {"chunks", r.chunks()}};
  if (!r.text().empty() || r.tokens_size() > 0) {
    out["text"] = r.text();
    out["tokens"] = std::vector<int32_t>(r.tokens().begin(), r.tokens().end());
  }
  if (r.logprobs_size() > 0) out["logprobs"] = LogprobsJson(r.logprobs());
  if (r.tool_calls_size() > 0) out["tool_calls"] = ToolCallsJson(r.tool_calls());
  return out;
}

json EmbedReplyJson(const v1::EmbedReply& r) {
  json embeddings = json::array(), tokens = json::array();
  for (const v1::Embedding& e : r.embeddings()) {
    embeddings.push_back(std::vector<float>(e.values().begin(), e.values().end()));
    tokens.push_back(e.tokens());
  }
  return {{"embeddings", std::move(embeddings)},
          {"dimensions", r.dimensions()},
          {"prompt_tokens", r.prompt_tokens()},
          {"tokens", std::move(tokens)},
          {"embed_us", r.embed_us()}};
}

json LoadJson(const v1::LoadReply& r) {
  json evicted = json::array();
  for (const std::string& name : r.evicted()) evicted.push_back(name);
  return {{"model", r.model()},
          {"bytes", r.bytes()},
          {"weight_bytes", r.weight_bytes()},
          {"workspace_bytes", r.workspace_bytes()},
          {"total_bytes", r.weight_bytes() + r.workspace_bytes()},
          {"load_ms", r.load_ms()},
          {"already_loaded", r.already_loaded()},
          {"replicas", r.replicas()},
          {"replicas_before", r.replicas_before()},
          {"replicas_asked", r.replicas_asked()},
          {"replicas_capped", r.replicas_capped().empty() ? json(nullptr) : json(r.replicas_capped())},
          {"evicted", evicted}};
}

json MatrixJson(const client::Matrix& m) {
  json rows = json::array();
  for (uint32_t r = 0; r < m.rows; r++) {
    json row = json::array();
    for (uint32_t c = 0; c < m.cols; c++) row.push_back(m.data[uint64_t{r} * m.cols + c]);
    rows.push_back(std::move(row));
  }
  return rows;
}

Result<client::Matrix> MatrixFromJson(const std::string& text) {
  json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) {
    return Error(Code::kInvalidArgument, "input is not valid JSON: expected a list of rows, e.g. [[1, 2], [3, 4]]");
  }
  return MatrixFromJson(doc);
}

Result<client::Matrix> MatrixFromJson(const json& doc) {
  if (!doc.is_array() || doc.empty()) {
    return Error(Code::kInvalidArgument, "input must be a non-empty list of rows, e.g. [[1, 2], [3, 4]]");
  }
  client::Matrix m;
  m.rows = static_cast<uint32_t>(doc.size());
  for (size_t r = 0; r < doc.size(); r++) {
    const json& row = doc[r];
    if (!row.is_array() || row.empty()) {
      return Error(Code::kInvalidArgument, "input row {} is not a non-empty list of numbers", r);
    }
    if (r == 0) m.cols = static_cast<uint32_t>(row.size());
    if (row.size() != m.cols) {
      return Error(Code::kInvalidArgument, "input row {} has {} values but row 0 has {}", r,
                   row.size(), m.cols);
    }
    for (size_t c = 0; c < row.size(); c++) {
      if (!row[c].is_number()) {
        return Error(Code::kInvalidArgument, "input row {} column {} is not a number", r, c);
      }
      double v = row[c].get<double>();
      if (!std::isfinite(v)) return Error(Code::kInvalidArgument, "input row {} column {} is not finite", r, c);
      if (std::fabs(v) > std::numeric_limits<float>::max()) {
        return Error(Code::kInvalidArgument,
                     "input row {} column {} is {}, outside the range of f32 (about ±3.4e38)", r, c, v);
      }
      m.data.push_back(static_cast<float>(v));
    }
  }
  return m;
}

}  // namespace warmpool::replyjson
