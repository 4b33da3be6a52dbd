// Embeddings on the serving thread: the engine's embed call (engine.h, version 4) over the
// request's inputs, answered by one done message. Between inputs and the pieces of a long one the
// worker does what it does between a generation's steps: heartbeats, a cancel (its client left),
// the deadline.
#include <algorithm>
#include <chrono>

#include "common/clock.h"
#include "ipc/error_proto.h"
#include "worker/embed_dimensions.h"
#include "worker/serving.h"

namespace warmpool::worker {

void Serving::HandleEmbed(const v1::WorkerInfer& request) {
  const uint64_t job = request.job();
  const v1::EmbedRequest& e = request.embed();
  v1::WorkerEnvelope reply;
  v1::WorkerInferDone* done = reply.mutable_infer_done();
  done->set_job(job);
  std::shared_ptr<Engine> engine = models_.Find(request.model());
  // What dimensions may ask for is the engine's size: the daemon checked it where it knew it.
  Status refused = OkStatus();
  if (engine != nullptr && !engine->embeds()) {
    refused = Error(Code::kFailedPrecondition, "model \"{}\" makes no embeddings (its engine has no embed call)", e.model());
  } else if (engine != nullptr && e.dimensions() > engine->info().embedding_size && !e.whole_past_size()) {
    refused = Error(Code::kInvalidArgument, "dimensions {}: model \"{}\" embeds in {} values; ask for 1 to {} (leave it out for all)",
                    e.dimensions(), e.model(), engine->info().embedding_size, engine->info().embedding_size);
  }
  Result<uint32_t> slot = BeginLongJob(request, engine, refused);
  if (!slot.ok()) {
    ipc::SetError(done->mutable_error(), slot.status());
    outbox_.Send(reply);
    return;
  }
  JobFaults faults = outbox_.FaultsFor(job, request.faults());
  faults.Hit("infer.after_take");
  const auto start = std::chrono::steady_clock::now();
  auto last_heard = start;
  bool past_deadline = false;
  Result<Engine::Embeddings> out = engine->Embed({e.input().begin(), e.input().end()}, [&](uint64_t, uint64_t) {
    HeartbeatIfDue(job, last_heard);
    if (!BetweenSteps(job)) return false;
    past_deadline = request.deadline_unix_ms() != 0 && UnixMillis() > request.deadline_unix_ms();
    return !past_deadline;
  });
  faults.Hit("infer.before_restore");
  marks_.Release(*slot);
  cancelled_.erase(job);
  if (!out.ok() && past_deadline) out = Error(Code::kDeadlineExceeded, "the embeddings passed their deadline");
  if (!out.ok()) {
    ipc::SetError(done->mutable_error(), out.status());
    outbox_.Send(reply);
    return;
  }
  v1::EmbedReply* answer = done->mutable_embed();
  const uint32_t size = engine->info().embedding_size;
  const uint32_t kept = e.dimensions() != 0 ? std::min(e.dimensions(), size) : size;
  answer->set_dimensions(kept);
  uint32_t tokens = 0;
  for (int i = 0; i < e.input_size(); i++) {
    v1::Embedding* embedding = answer->add_embeddings();
    float* values = out->values.data() + uint64_t(i) * size;
    if (kept < size) ShortenEmbedding({values, size}, kept);
    embedding->mutable_values()->Add(values, values + kept);
    embedding->set_tokens(out->tokens[i]);
    tokens += out->tokens[i];
  }
  answer->set_prompt_tokens(tokens);
  answer->set_embed_us(static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start).count()));
  outbox_.Send(reply);
}

}  // namespace warmpool::worker
