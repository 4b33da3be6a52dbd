#include "worker/generation_stream.h"

#include <fmt/format.h>

#include "common/clock.h"
#include "common/utf8.h"
#include "ipc/error_proto.h"

namespace warmpool::worker {
namespace {

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

// The engine's log-probabilities into the protocol's.
void AddLogprobs(std::span<const wp_token_logprobs> from, google::protobuf::RepeatedPtrField<v1::TokenLogprobs>* to) {
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
}

}  // namespace

GenerationStream::GenerationStream(const v1::WorkerInfer& request, Outbox& outbox, JobFaults faults)
    : request_(request),
      outbox_(outbox),
      faults_(std::move(faults)),
      start_(std::chrono::steady_clock::now()),
      last_heard_(start_) {
  reply_.mutable_infer_done()->set_job(request.job());
  reply_.mutable_infer_done()->mutable_generate();
  if (request.generate().tools_size() > 0) {
    Result<chat::ToolCallFormat> format = chat::ParseToolCallFormat(request.tool_call_format());
    if (format.ok() && *format != chat::ToolCallFormat::kNone) calls_.emplace(*format);
  }
}

bool GenerationStream::PastDeadline() const {
  return request_.deadline_unix_ms() != 0 && UnixMillis() > request_.deadline_unix_ms();
}

void GenerationStream::AddCalls(std::vector<chat::ToolCall>& found,
                                google::protobuf::RepeatedPtrField<v1::ToolCall>* to) {
  for (chat::ToolCall& c : found) {
    v1::ToolCall* call = to->Add();
    call->set_id(fmt::format("call_{:x}_{}", job(), call_count_++));  // job ids are unique in the daemon's life
    call->set_name(ValidUtf8(c.name));
    call->set_arguments(ValidUtf8(c.arguments));
  }
}

void GenerationStream::SendChunk(std::string text, std::span<const int32_t> tokens,
                                 std::span<const wp_token_logprobs> logprobs, std::vector<chat::ToolCall>& calls) {
  last_heard_ = std::chrono::steady_clock::now();
  v1::WorkerEnvelope chunk;
  chunk.mutable_infer_chunk()->set_job(job());
  v1::GenerateChunk* c = chunk.mutable_infer_chunk()->mutable_chunk();
  c->set_index(chunks_++);
  c->set_text(std::move(text));
  c->mutable_tokens()->Add(tokens.begin(), tokens.end());
  AddLogprobs(logprobs, c->mutable_logprobs());
  AddCalls(calls, c->mutable_tool_calls());
  StampKvUsage(chunk.mutable_infer_chunk()->mutable_kv_usage());
  outbox_.Send(chunk);
}

void WriteKvUsage(const Engine::KvCacheUsage& usage, v1::KvUsage* to) {
  to->set_blocks_held(usage.held);
  to->set_blocks(usage.blocks);
  to->set_blocks_reserved(usage.reserved);
}

void GenerationStream::StampKvUsage(v1::KvUsage* to) const {
  if (kv_usage_) WriteKvUsage(*kv_usage_, to);
}

void GenerationStream::Emit(std::string_view text, std::span<const int32_t> tokens,
                            std::span<const wp_token_logprobs> logprobs) {
  v1::GenerateReply* final = reply_.mutable_infer_done()->mutable_generate();
  if (first_ && !tokens.empty()) {
    first_ = false;
    final->set_first_token_us(MicrosSince(start_));
  }
  // An engine's text on its way into a protobuf string, which must be valid UTF-8 (a plugin's may
  // not be: a frame that does not parse would cost this worker its life).
  std::string shown = ValidUtf8(std::string(text));
  chat::ToolCallText read;
  if (calls_) {
    read = calls_->Feed(shown);
    shown = std::move(read.content);
  }
  const bool stream = request_.generate().stream();
  if (stream && !(text.empty() && tokens.empty())) {
    SendChunk(std::move(shown), tokens, logprobs, read.calls);
    if (chunks_ == 1) faults_.Hit("infer.mid");  // mid-stream: a chunk is out, the rest is not
    return;
  }
  if (!stream) {
    final->mutable_text()->append(shown);
    final->mutable_tokens()->Add(tokens.begin(), tokens.end());
    AddLogprobs(logprobs, final->mutable_logprobs());
    AddCalls(read.calls, final->mutable_tool_calls());
  }
  // Nothing to send (a step not streamed, or progress: a chunk of neither text nor tokens).
  HeartbeatIfDue();
}

void GenerationStream::HeartbeatIfDue() {
  const auto now = std::chrono::steady_clock::now();
  if (now - last_heard_ <= kHeartbeatInterval) return;
  last_heard_ = now;
  v1::WorkerEnvelope heartbeat;
  heartbeat.mutable_infer_chunk()->set_job(job());
  StampKvUsage(heartbeat.mutable_infer_chunk()->mutable_kv_usage());
  outbox_.Send(heartbeat);
}

void GenerationStream::Finish(Result<wp_generate_result> result, bool past_deadline, uint32_t cached_tokens) {
  v1::WorkerInferDone* done = reply_.mutable_infer_done();
  StampKvUsage(done->mutable_kv_usage());
  if (result.ok() && past_deadline) {
    // Ended by its deadline, not by its client: the error the deadline is (the chunks sent stand).
    result = Error(Code::kDeadlineExceeded, "the generation passed its deadline after {} tokens",
                   result->completion_tokens);
  }
  if (!result.ok()) {
    done->clear_generate();
    ipc::SetError(done->mutable_error(), result.status());
    outbox_.Send(reply_);
    return;
  }
  v1::GenerateReply* final = done->mutable_generate();
  const bool stream = request_.generate().stream();
  if (calls_) {
    // What the reader held back (text that might have begun a call) comes out now, before the end.
    chat::ToolCallText rest = calls_->Finish();
    if (!stream) {
      final->mutable_text()->append(rest.content);
      AddCalls(rest.calls, final->mutable_tool_calls());
    } else if (!rest.content.empty() || !rest.calls.empty()) {
      SendChunk(std::move(rest.content), {}, {}, rest.calls);
    }
  }
  const bool called = calls_ && calls_->saw_calls() && result->finish_reason == WP_FINISH_STOP;
  final->set_finish_reason(called ? "tool_calls" : FinishName(result->finish_reason));
  final->set_prompt_tokens(result->prompt_tokens);
  final->set_cached_prompt_tokens(std::min(cached_tokens, result->prompt_tokens));
  final->set_completion_tokens(result->completion_tokens);
  final->set_generate_us(MicrosSince(start_));
  final->set_chunks(chunks_);
  outbox_.Send(reply_);
}

}  // namespace warmpool::worker
