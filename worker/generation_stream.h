// One generation's answer on its way to the supervisor, whoever runs it (the engine's generate call,
// or a step of several sequences: worker/generation_batch.cc): each step's text, tokens,
// log-probabilities and tool calls as a chunk (or gathered into the final reply when the request
// does not stream), heartbeats while there is nothing to send, and one done message at the end.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <utility>

#include "common/status.h"
#include "engines/builtin.h"
#include "engines/chat_template/tool_calls.h"
#include "ipc/worker.pb.h"
#include "warmpool/engine.h"
#include "worker/fault_injector.h"
#include "worker/outbox.h"

namespace warmpool::worker {

// A long job that has sent nothing for this long sends a heartbeat (an empty WorkerInferChunk): the
// supervisor takes one that says nothing for its stall limit for hung.
inline constexpr std::chrono::seconds kHeartbeatInterval{1};

// An engine's KV cache as the supervisor is told it.
void WriteKvUsage(const Engine::KvCacheUsage& usage, v1::KvUsage* to);

class GenerationStream {
 public:
  // request: the job's, alive as long as the stream; faults: its fault points.
  GenerationStream(const v1::WorkerInfer& request, Outbox& outbox, JobFaults faults);

  uint64_t job() const { return request_.job(); }
  const v1::WorkerInfer& request() const { return request_; }
  JobFaults& faults() { return faults_; }
  // The request's deadline passed (checked between steps).
  bool PastDeadline() const;

  // One step's output. A step that made nothing to send (a prompt's piece) is a heartbeat when one is
  // due: a long prompt is not taken for a hung worker.
  void Emit(std::string_view text, std::span<const int32_t> tokens, std::span<const wp_token_logprobs> logprobs);
  void HeartbeatIfDue();

  // The end, sent once: the engine's result (its error, or why it finished and its counts). A result
  // that is a deadline's stop becomes DEADLINE_EXCEEDED (the chunks sent stand). cached_tokens: of
  // the prompt's, those the engine found in its prefix cache.
  void Finish(Result<wp_generate_result> result, bool past_deadline, uint32_t cached_tokens = 0);
  // The engine's KV cache as it stands (Engine::KvUsage), told with every message from now on.
  void SetKvUsage(std::optional<Engine::KvCacheUsage> usage) { kv_usage_ = usage; }

 private:
  void AddCalls(std::vector<chat::ToolCall>& found, google::protobuf::RepeatedPtrField<v1::ToolCall>* to);
  void SendChunk(std::string text, std::span<const int32_t> tokens, std::span<const wp_token_logprobs> logprobs,
                 std::vector<chat::ToolCall>& calls);

  void StampKvUsage(v1::KvUsage* to) const;

  const v1::WorkerInfer& request_;
  Outbox& outbox_;
  std::optional<Engine::KvCacheUsage> kv_usage_;
  JobFaults faults_;
  v1::WorkerEnvelope reply_;  // the done message, its generate reply filled as it goes when not streamed
  std::optional<chat::ToolCallReader> calls_;  // the model's calls of the tools offered, read from its text
  uint32_t call_count_ = 0;
  uint32_t chunks_ = 0;
  bool first_ = true;
  const std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_heard_;
};

}  // namespace warmpool::worker
