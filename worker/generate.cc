// A language model's generation on the serving thread. An engine that steps sequences together
// (engine ABI version 7) serves it with whatever else runs for the model (worker/generation_batch.cc);
// an older one runs it alone through its generate call. Either way each step's output goes out as
// it is made (worker/generation_stream.h), and the job ends within a step when the supervisor
// cancels it (its client left) or its deadline passes.

#include <chrono>
#include <optional>

#include <nlohmann/json.hpp>

#include "common/clock.h"
#include "common/utf8.h"
#include "engines/chat_template/tool_calls.h"
#include "ipc/error_proto.h"
#include "worker/generation_stream.h"
#include "worker/serving.h"

namespace warmpool::worker {
namespace {

// Whether a chat carries what only a conversation document holds (engine ABI version 6): tools
// offered, an assistant's calls, a tool's answers.
bool NeedsConversation(const v1::GenerateRequest& g) {
  if (g.tools_size() > 0) return true;
  for (const v1::ChatMessage& m : g.messages()) {
    if (m.tool_calls_size() > 0 || !m.tool_call_id().empty() || (m.role() == "tool" && !m.name().empty())) return true;
  }
  return false;
}

// The chat as the JSON document wp_generate_request.conversation is: messages as OpenAI's API and
// the chat templates have them (a call's arguments an object, as templates render them).
Result<std::string> ConversationJson(const v1::GenerateRequest& g) {
  using json = nlohmann::ordered_json;
  json messages = json::array();
  for (const v1::ChatMessage& m : g.messages()) {
    json message = {{"role", m.role()}, {"content", m.content()}};
    if (m.tool_calls_size() > 0) {
      json calls = json::array();
      for (const v1::ToolCall& c : m.tool_calls()) {
        json arguments = json::parse(c.arguments(), nullptr, false);
        if (!arguments.is_object()) {
          return Error(Code::kInvalidArgument, "the arguments of tool call \"{}\" are not a JSON object", c.id());
        }
        calls.push_back({{"id", c.id()},
                         {"type", "function"},
                         {"function", {{"name", c.name()}, {"arguments", std::move(arguments)}}}});
      }
      message["tool_calls"] = std::move(calls);
    }
    if (!m.tool_call_id().empty()) message["tool_call_id"] = m.tool_call_id();
    if (m.role() == "tool" && !m.name().empty()) message["name"] = m.name();
    messages.push_back(std::move(message));
  }
  json doc = {{"messages", std::move(messages)}};
  if (g.tools_size() > 0) {
    json tools = json::array();
    for (const std::string& t : g.tools()) {
      json tool = json::parse(t, nullptr, false);
      if (!tool.is_object()) return Error(Code::kInvalidArgument, "each tool must be a JSON object");
      tools.push_back(std::move(tool));
    }
    doc["tools"] = std::move(tools);
  }
  return doc.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace

bool Serving::BetweenSteps(uint64_t job) {
  ReadWhileBusy();
  return read_error_.ok() && !cancelled_.contains(job);
}

void Serving::ReadWhileBusy() {
  while (read_error_.ok() && channel_.WaitForFrame(0)) {
    Incoming in;
    if (Status s = ReadIncoming(in); !s.ok()) {
      read_error_ = s;  // the channel is gone: stop, and let Run end
      break;
    }
    if (!HandleControl(in)) deferred_.push_back(std::move(in));
  }
}

void Serving::HeartbeatIfDue(uint64_t job, std::chrono::steady_clock::time_point& last_heard) {
  const auto now = std::chrono::steady_clock::now();
  if (now - last_heard <= kHeartbeatInterval) return;
  last_heard = now;
  v1::WorkerEnvelope heartbeat;
  heartbeat.mutable_infer_chunk()->set_job(job);
  outbox_.Send(heartbeat);
}

Result<uint32_t> Serving::BeginLongJob(const v1::WorkerInfer& request, const std::shared_ptr<Engine>& engine,
                                       const Status& unable, uint64_t oldest_running) {
  const uint64_t job = request.job();
  // Jobs start in the order of their ids: a cancel of one below the oldest still running is of one
  // that ended.
  cancelled_.erase(cancelled_.begin(), cancelled_.lower_bound(std::min(job, oldest_running)));
  if (engine == nullptr) {
    return Error(Code::kUnavailable, "model {} is not loaded in worker {}", request.model(), options_.slot);
  }
  if (!unable.ok()) return unable;
  if (request.deadline_unix_ms() != 0 && UnixMillis() > request.deadline_unix_ms()) {
    return Error(Code::kDeadlineExceeded, "the request's deadline passed before it ran");
  }
  if (cancelled_.contains(job)) return Error(Code::kUnavailable, "cancelled before it ran: its client left");
  return marks_.Take(request.request_id(), request.model());
}

Status Serving::ToEngineRequest(const v1::WorkerInfer& infer, EngineRequest& out) {
  const v1::GenerateRequest& g = infer.generate();
  for (const std::string& stop : g.stop()) out.stops.push_back({stop.data(), stop.size()});
  for (const v1::ChatMessage& m : g.messages()) {
    out.roles.push_back({m.role().data(), m.role().size()});
    out.contents.push_back({m.content().data(), m.content().size()});
  }
  wp_generate_request& r = out.request;
  r.prompt = {g.prompt().data(), g.prompt().size()};
  r.tokens = g.tokens().data();
  r.token_count = static_cast<uint64_t>(g.tokens().size());
  r.max_tokens = g.max_tokens();
  if (g.has_temperature()) r.set |= WP_SET_TEMPERATURE, r.temperature = g.temperature();
  if (g.has_top_k()) r.set |= WP_SET_TOP_K, r.top_k = g.top_k();
  if (g.has_top_p()) r.set |= WP_SET_TOP_P, r.top_p = g.top_p();
  if (g.has_min_p()) r.set |= WP_SET_MIN_P, r.min_p = g.min_p();
  if (g.has_repetition_penalty()) r.set |= WP_SET_REPETITION_PENALTY, r.repetition_penalty = g.repetition_penalty();
  if (g.has_seed()) r.set |= WP_SET_SEED, r.seed = g.seed();
  r.stop = out.stops.data();
  r.stop_count = static_cast<uint32_t>(out.stops.size());
  r.resume_tokens = infer.resume_tokens().data();
  r.resume_count = static_cast<uint32_t>(infer.resume_tokens_size());
  r.kv_source = -1;  // none (with kv_source_bytes 0)
  // Its size as the supervisor kept it (the load's cache_bytes): a device region's handle has none
  // of its own. The engine checks the region against it before reading (a memfd's size too).
  if (out.kv_source >= 0 && infer.kv_source_bytes() > 0) {
    r.kv_source = out.kv_source;
    r.kv_source_bytes = infer.kv_source_bytes();
  }
  r.preemptible = infer.preemptible() ? 1 : 0;
  r.arrival = infer.arrival_ms();
  r.logprobs = g.logprobs() ? 1 : 0;
  r.top_logprobs = g.top_logprobs();
  if (NeedsConversation(g)) {
    Result<std::string> doc = ConversationJson(g);
    if (!doc.ok()) return doc.status();
    out.conversation = std::move(*doc);
    r.conversation = {out.conversation.data(), out.conversation.size()};
  } else {
    r.roles = out.roles.data();
    r.contents = out.contents.data();
    r.message_count = static_cast<uint32_t>(out.roles.size());
  }
  return OkStatus();
}

void Serving::SendGenerateError(uint64_t job, const Status& status) {
  v1::WorkerEnvelope reply;
  reply.mutable_infer_done()->set_job(job);
  ipc::SetError(reply.mutable_infer_done()->mutable_error(), status);
  outbox_.Send(reply);
}

void Serving::HandleGenerate(v1::WorkerInfer request) {
  std::shared_ptr<Engine> engine = models_.Find(request.model());
  if (engine != nullptr && engine->generates() && engine->steps()) return ServeGenerations(std::move(request), engine);
  const uint64_t job = request.job();
  EngineRequest args;
  args.kv_source = TakeKvSource(job);
  const v1::GenerateRequest& g = request.generate();
  Result<uint32_t> slot = BeginLongJob(
      request, engine,
      engine != nullptr && !engine->generates()
          ? Error(Code::kFailedPrecondition, "model \"{}\" is not a language model: send it tensors (infer)", g.model())
          : OkStatus());
  if (!slot.ok()) return SendGenerateError(job, slot.status());
  GenerationStream stream(request, outbox_, outbox_.FaultsFor(job, request.faults()));
  stream.faults().Hit("infer.after_take");
  if (Status built = ToEngineRequest(request, args); !built.ok()) {
    marks_.Release(*slot);
    return SendGenerateError(job, built);
  }
  bool past_deadline = false;
  Result<wp_generate_result> result = engine->Generate(
      args.request,
      [&](std::string_view text, std::span<const int32_t> tokens, std::span<const wp_token_logprobs> logprobs) {
        stream.Emit(text, tokens, logprobs);
        if (!BetweenSteps(job)) return false;
        past_deadline = stream.PastDeadline();
        return !past_deadline;
      });
  stream.faults().Hit("infer.before_restore");
  marks_.Release(*slot);
  cancelled_.erase(job);
  stream.Finish(std::move(result), past_deadline);
}

}  // namespace warmpool::worker
