// A language model's generation on the serving thread: the engine's generate call (engine.h,
// version 3), each step's text sent as a chunk as soon as it is made, and one done message at the
// end. The engine stops within a step when the supervisor cancels the job (its client left) or
// the request's deadline passes.
#include <chrono>
#include <optional>

#include <nlohmann/json.hpp>

#include "common/clock.h"
#include "common/utf8.h"
#include "engines/chat_template/tool_calls.h"
#include "ipc/error_proto.h"
#include "worker/serving.h"

namespace warmpool::worker {
namespace {

constexpr std::chrono::seconds kHeartbeat{1};

uint64_t MicrosSince(std::chrono::steady_clock::time_point start) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start).count());
}

const char* FinishName(uint32_t reason) {
  switch (reason) {
    case WP_FINISH_STOP: return "stop";
    case WP_FINISH_LENGTH: return "length";
    default: return "cancelled";
  }
}

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
  while (read_error_.ok() && channel_.WaitForFrame(0)) {
    Incoming in;
    if (Status s = ReadIncoming(in); !s.ok()) {
      read_error_ = s;  // the channel is gone: stop, and let Run end
      break;
    }
    if (!HandleControl(in)) deferred_.push_back(std::move(in));
  }
  return read_error_.ok() && !cancelled_.contains(job);
}

void Serving::HeartbeatIfDue(uint64_t job, std::chrono::steady_clock::time_point& last_heard) {
  const auto now = std::chrono::steady_clock::now();
  if (now - last_heard <= kHeartbeat) return;
  last_heard = now;
  v1::WorkerEnvelope heartbeat;
  heartbeat.mutable_infer_chunk()->set_job(job);
  outbox_.Send(heartbeat);
}

Result<uint32_t> Serving::BeginLongJob(const v1::WorkerInfer& request, const std::shared_ptr<Engine>& engine,
                                       const Status& unable) {
  const uint64_t job = request.job();
  cancelled_.erase(cancelled_.begin(), cancelled_.lower_bound(job));  // ended before this one
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

void Serving::HandleGenerate(const v1::WorkerInfer& request) {
  const uint64_t job = request.job();
  const v1::GenerateRequest& g = request.generate();
  v1::WorkerEnvelope reply;
  v1::WorkerInferDone* done = reply.mutable_infer_done();
  done->set_job(job);
  std::shared_ptr<Engine> engine = models_.Find(request.model());
  Result<uint32_t> slot = BeginLongJob(
      request, engine,
      engine != nullptr && !engine->generates()
          ? Error(Code::kFailedPrecondition, "model \"{}\" is not a language model: send it tensors (infer)", g.model())
          : OkStatus());
  if (!slot.ok()) {
    ipc::SetError(done->mutable_error(), slot.status());
    outbox_.Send(reply);
    return;
  }
  JobFaults faults = outbox_.FaultsFor(job, request.faults());
  faults.Hit("infer.after_take");

  std::vector<wp_string> stops, roles, contents;
  for (const std::string& stop : g.stop()) stops.push_back({stop.data(), stop.size()});
  for (const v1::ChatMessage& m : g.messages()) {
    roles.push_back({m.role().data(), m.role().size()});
    contents.push_back({m.content().data(), m.content().size()});
  }
  wp_generate_request r{};
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
  r.stop = stops.data();
  r.stop_count = static_cast<uint32_t>(stops.size());
  std::string conversation;
  if (NeedsConversation(g)) {
    Result<std::string> doc = ConversationJson(g);
    if (!doc.ok()) {
      marks_.Release(*slot);
      ipc::SetError(done->mutable_error(), doc.status());
      outbox_.Send(reply);
      return;
    }
    conversation = std::move(*doc);
    r.conversation = {conversation.data(), conversation.size()};
  } else {
    r.roles = roles.data();
    r.contents = contents.data();
    r.message_count = static_cast<uint32_t>(roles.size());
  }
  // The model's calls of the tools offered, read out of its text as it comes (tool_calls.h).
  std::optional<chat::ToolCallReader> calls;
  if (g.tools_size() > 0) {
    Result<chat::ToolCallFormat> format = chat::ParseToolCallFormat(request.tool_call_format());
    if (format.ok() && *format != chat::ToolCallFormat::kNone) calls.emplace(*format);
  }
  uint32_t call_count = 0;
  auto add_calls = [&](std::vector<chat::ToolCall>& found, google::protobuf::RepeatedPtrField<v1::ToolCall>* to) {
    for (chat::ToolCall& c : found) {
      v1::ToolCall* call = to->Add();
      call->set_id(fmt::format("call_{:x}_{}", job, call_count++));  // job ids are unique in the daemon's life
      call->set_name(ValidUtf8(c.name));
      call->set_arguments(ValidUtf8(c.arguments));
    }
  };

  v1::GenerateReply* final = done->mutable_generate();
  const auto start = std::chrono::steady_clock::now();
  uint32_t chunks = 0;
  bool first = true;
  bool past_deadline = false;
  auto last_heard = start;
  r.logprobs = g.logprobs() ? 1 : 0;
  r.top_logprobs = g.top_logprobs();
  // The engine's log-probabilities into the protocol's.
  auto add_logprobs = [](std::span<const wp_token_logprobs> from,
                         google::protobuf::RepeatedPtrField<v1::TokenLogprobs>* to) {
    auto set = [](const wp_logprob& l, v1::TokenLogprob* out) {
      out->set_token(l.token);
      out->set_logprob(l.logprob);
      if (l.piece.data != nullptr) out->set_piece(l.piece.data, l.piece.bytes);
    };
    for (const wp_token_logprobs& l : from) {
      v1::TokenLogprobs* out = to->Add();
      set(l.chosen, out->mutable_chosen());
      for (uint32_t i = 0; l.top != nullptr && i < l.top_count; i++) set(l.top[i], out->add_top());
    }
  };
  Result<wp_generate_result> result = engine->Generate(r, [&](std::string_view text, std::span<const int32_t> tokens,
                                                              std::span<const wp_token_logprobs> logprobs) {
    const auto now = std::chrono::steady_clock::now();
    if (first && !tokens.empty()) {
      first = false;
      final->set_first_token_us(MicrosSince(start));
    }
    // An engine's text on its way into a protobuf string, which must be valid UTF-8 (a plugin's
    // may not be: a frame that does not parse would cost this worker its life).
    std::string shown = ValidUtf8(std::string(text));
    chat::ToolCallText read;
    if (calls) {
      read = calls->Feed(shown);
      shown = std::move(read.content);
    }
    if (g.stream() && !(text.empty() && tokens.empty())) {
      last_heard = now;
      v1::WorkerEnvelope chunk;
      chunk.mutable_infer_chunk()->set_job(job);
      v1::GenerateChunk* c = chunk.mutable_infer_chunk()->mutable_chunk();
      c->set_index(chunks++);
      c->set_text(std::move(shown));
      c->mutable_tokens()->Add(tokens.begin(), tokens.end());
      add_logprobs(logprobs, c->mutable_logprobs());
      add_calls(read.calls, c->mutable_tool_calls());
      outbox_.Send(chunk);
      if (chunks == 1) faults.Hit("infer.mid");  // mid-stream: a chunk is out, the rest is not
    } else {
      if (!g.stream()) {
        final->mutable_text()->append(shown);
        final->mutable_tokens()->Add(tokens.begin(), tokens.end());
        add_logprobs(logprobs, final->mutable_logprobs());
        add_calls(read.calls, final->mutable_tool_calls());
      }
      // Nothing to send (a step not streamed, or progress: a chunk of neither text nor tokens).
      HeartbeatIfDue(job, last_heard);
    }
    if (!BetweenSteps(job)) return false;
    past_deadline = request.deadline_unix_ms() != 0 && UnixMillis() > request.deadline_unix_ms();
    return !past_deadline;
  });
  faults.Hit("infer.before_restore");
  marks_.Release(*slot);
  cancelled_.erase(job);
  if (result.ok() && past_deadline) {
    // Ended by its deadline, not by its client: the error the deadline is (the chunks sent stand).
    result = Error(Code::kDeadlineExceeded, "the generation passed its deadline after {} tokens",
                   result->completion_tokens);
  }
  if (!result.ok()) {
    done->clear_generate();
    ipc::SetError(done->mutable_error(), result.status());
  } else {
    if (calls) {
      // What the reader held back (text that might have begun a call) comes out now, before the end.
      chat::ToolCallText rest = calls->Finish();
      if (!g.stream()) {
        final->mutable_text()->append(rest.content);
        add_calls(rest.calls, final->mutable_tool_calls());
      } else if (!rest.content.empty() || !rest.calls.empty()) {
        v1::WorkerEnvelope chunk;
        chunk.mutable_infer_chunk()->set_job(job);
        v1::GenerateChunk* c = chunk.mutable_infer_chunk()->mutable_chunk();
        c->set_index(chunks++);
        c->set_text(std::move(rest.content));
        add_calls(rest.calls, c->mutable_tool_calls());
        outbox_.Send(chunk);
      }
    }
    const bool called = calls && calls->saw_calls() && result->finish_reason == WP_FINISH_STOP;
    final->set_finish_reason(called ? "tool_calls" : FinishName(result->finish_reason));
    final->set_prompt_tokens(result->prompt_tokens);
    final->set_completion_tokens(result->completion_tokens);
    final->set_generate_us(MicrosSince(start));
    final->set_chunks(chunks);
  }
  outbox_.Send(reply);
}

}  // namespace warmpool::worker
