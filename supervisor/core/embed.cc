// Embeddings from a language model: queued, admitted, dispatched and retried as an inference is (a
// Waiter, then a kInfer Job on one of the model's workers, which answers with one WorkerInferDone),
// answered with vectors. Judged as a generation is: no default deadline (many long inputs take as
// long as they take), a worker that says nothing for load_stall_ms is taken for hung (it sends
// heartbeats between inputs and pieces of a long one), and a client that leaves cancels it.
#include "supervisor/core/core.h"
#include "supervisor/core/request_check.h"

namespace warmpool::supervisor {

uint64_t EmbedReplyBytes(int inputs, uint32_t embedding_size) {
  // A float is 4 bytes packed; each embedding's message, tag and token count take under 16 more.
  return static_cast<uint64_t>(inputs) * (uint64_t{embedding_size} * sizeof(float) + 16) + 64;
}

void Core::HandleEmbed(Call call, v1::EmbedRequest&& request) {
  Result<uint32_t> found = FindServing(request.model());
  if (!found.ok()) return AnswerError(call, found.status());
  const uint32_t model = *found;
  Model& m = models_[model];
  if (!m.entry.generates()) {
    return AnswerError(call, Error(Code::kFailedPrecondition,
                                   "model \"{}\" is not a language model (engine \"{}\"): it makes no embeddings",
                                   m.entry.name, m.entry.engine));
  }
  // Known from the registration (or a worker's load report; a manifest of an older daemon may not
  // say: then the worker checks).
  if (m.entry.embedding_size != 0 && request.dimensions() >= m.entry.embedding_size && request.whole_past_size()) {
    request.set_dimensions(0);
  }
  if (m.entry.embedding_size != 0 && request.dimensions() > m.entry.embedding_size) {
    return AnswerError(call, Error(Code::kInvalidArgument,
                                   "dimensions {}: model \"{}\" embeds in {} values; ask for 1 to {} (leave it out for "
                                   "all)",
                                   request.dimensions(), m.entry.name, m.entry.embedding_size,
                                   m.entry.embedding_size));
  }
  // The reply must fit a frame: a vector per input.
  const uint32_t size = request.dimensions() != 0 ? request.dimensions() : m.entry.embedding_size;
  const uint64_t reply_bytes = EmbedReplyBytes(request.input_size(), size);
  if (reply_bytes + 1024 > config_.max_frame_bytes) {
    return AnswerError(call, Error(Code::kInvalidArgument,
                                   "{} embeddings of {} floats take {} bytes, more than a frame's {} "
                                   "([limits] max_frame_bytes): send fewer inputs at a time",
                                   request.input_size(), size, reply_bytes,
                                   config_.max_frame_bytes));
  }
  for (int i = 0; i < request.input_size(); i++) {
    if (request.input(i).size() > uint64_t{m.entry.context} * kMaxBytesPerToken) {
      return AnswerError(call, Error(Code::kInvalidArgument,
                                     "input {} ({} bytes) does not fit the context of {} tokens of model \"{}\": "
                                     "shorten it",
                                     i, request.input(i).size(), m.entry.context, m.entry.name));
    }
  }
  if (request.has_keep_alive_ms()) m.keep_alive_override_ms = request.keep_alive_ms();
  Waiter waiter{call, true, {}, request.deadline_ms() == 0 ? 0 : MonoMs() + request.deadline_ms(), 0};
  const uint64_t bytes = request.ByteSizeLong();
  waiter.embed = std::move(request);
  EnqueueHeld(model, std::move(waiter), bytes);
}

void Core::AnswerEmbed(Job& job, v1::WorkerInferDone& done) {
  if (done.has_error()) {
    return AnswerError(job.call, Status(CodeFromInt(done.error().code()), done.error().message()));
  }
  v1::Envelope reply;
  *reply.mutable_embed_reply() = std::move(*done.mutable_embed());
  Answer(job.call, std::move(reply));
}

}  // namespace warmpool::supervisor
