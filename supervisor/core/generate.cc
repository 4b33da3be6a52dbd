// A language model's generation: queued, admitted and dispatched as an inference is (a Waiter, then
// a kInfer Job on one of the model's workers), answered differently. The worker streams chunks
// (WorkerInferChunk) and ends with one WorkerInferDone; the client gets the chunks in order,
// numbered by the core, then exactly one final reply, and nothing after it:
//   - a chunk is forwarded only while the job is unanswered and the client is there;
//   - a deadline or a drain answers the job (Job::answered): later chunks and the worker's own
//     final are dropped;
//   - a worker that dies after a chunk went out ends the stream with UNAVAILABLE (the text sent is
//     the client's; starting again would send it twice); one that dies before any is retried as an
//     inference is;
//   - a client that leaves gets its generations cancelled on their workers (WorkerCancel), which
//     end them within a step;
//   - one whose replica's KV cache has no room for it beside the generations running there (the
//     engine admits a generation by the blocks it may come to need) comes back unrun and waits at
//     the front of the queue until a replica says it has that room (RequeueKvRefused, WithKvRoom):
//     those behind it do not pass it, so a long one is not starved by short ones; so does one its
//     engine preempted for room for older ones (preemptible: the core can resume it after the
//     chunks sent), which then goes on after them.
#include "supervisor/core/core.h"
#include "supervisor/core/request_check.h"

namespace warmpool::supervisor {

void Core::HandleGenerate(Call call, v1::GenerateRequest&& request) {
  Result<uint32_t> found = FindServing(request.model());
  if (!found.ok()) return AnswerError(call, found.status());
  const uint32_t model = *found;
  Model& m = models_[model];
  if (!m.entry.generates()) {
    return AnswerError(call, Error(Code::kFailedPrecondition,
                                   "model \"{}\" is not a language model (engine \"{}\"): send it tensors (infer)",
                                   m.entry.name, m.entry.engine));
  }
  // Known from its description (registration, or the worker's load report): no worker is woken,
  // and no model loaded or evicted, for what it cannot do.
  if (m.entry.embeds_only) {
    return AnswerError(call, Error(Code::kFailedPrecondition,
                                   "model \"{}\" embeds only (its checkpoint has no output head): it cannot "
                                   "generate; send it embed requests",
                                   m.entry.name));
  }
  // A prompt the context cannot hold is refused here, before a worker spends time tokenizing it:
  // no token is longer than kMaxBytesPerToken, so a longer prompt has more tokens than the context.
  uint64_t text_bytes = request.prompt().size();
  for (const v1::ChatMessage& message : request.messages()) {
    text_bytes += message.content().size();
    for (const v1::ToolCall& call : message.tool_calls()) text_bytes += call.arguments().size();
  }
  for (const std::string& tool : request.tools()) text_bytes += tool.size();
  if (text_bytes > uint64_t{m.entry.context} * kMaxBytesPerToken ||
      static_cast<uint64_t>(request.tokens_size()) >= m.entry.context) {
    return AnswerError(call, Error(Code::kInvalidArgument,
                                   "the prompt ({} bytes, {} token ids) does not fit the context of {} tokens of "
                                   "model \"{}\": shorten it",
                                   text_bytes, request.tokens_size(), m.entry.context, m.entry.name));
  }
  if (request.tools_size() > 0 && m.tool_call_format.empty()) {
    return AnswerError(call, Error(Code::kFailedPrecondition,
                                   "model \"{}\" takes no tools: its chat template shows no tool-call format warmpool "
                                   "reads (hermes, llama3_json); if it has one, set tool_call_format in its [[models]] "
                                   "entry",
                                   m.entry.name));
  }
  if (request.has_keep_alive_ms()) m.keep_alive_override_ms = request.keep_alive_ms();
  // No default deadline: a generation ends by itself (max_tokens, the context), and a client that
  // stops waiting cancels it by leaving.
  Waiter waiter{call, true, {}, request.deadline_ms() == 0 ? 0 : MonoMs() + request.deadline_ms(), 0};
  const uint64_t bytes = request.ByteSizeLong();
  waiter.prefix_keys = PrefixKeys(request);
  waiter.generate = std::move(request);
  EnqueueHeld(model, std::move(waiter), bytes);
}

void Core::EnqueueHeld(uint32_t model, Waiter&& waiter, uint64_t bytes) {
  if (queued_ >= config_.max_queue) {
    return AnswerError(waiter.call, Error(Code::kResourceExhausted,
                                          "{} requests are already waiting (limit {}): retry later", queued_,
                                          config_.max_queue));
  }
  // What the daemon holds of the request (a prompt, inputs) counts against the same bounds as tensors.
  Session& session = sessions_[waiter.call.session];
  if (session.held_bytes + bytes > config_.max_queued_bytes_per_connection ||
      held_bytes_ + bytes > config_.max_queued_bytes) {
    return AnswerError(waiter.call, Error(Code::kResourceExhausted,
                                          "the daemon holds too much of this connection's or all clients' requests: "
                                          "wait for replies before sending more"));
  }
  waiter.call.bytes = bytes;
  session.held_bytes += bytes;
  held_bytes_ += bytes;
  Enqueue(model, std::move(waiter));
}

void Core::DispatchLanguageJob(uint32_t model, uint32_t worker, Waiter&& waiter) {
  if (waiter.chunks > 0 &&
      (waiter.resume_epoch != models_[model].epoch || waiter.resume_version != models_[model].entry.version)) {
    // Its stream began on weights a reload has since replaced: going on with others would mix them.
    return AnswerError(waiter.call, Error(Code::kUnavailable,
                                          "model \"{}\" changed (a reload) while its worker's death held the stream "
                                          "up after {} chunks: what was sent stands, ask again",
                                          models_[model].entry.name, waiter.chunks));
  }
  if (waiter.kv_source >= 0 &&
      (waiter.resume_epoch != models_[model].epoch || waiter.resume_version != models_[model].entry.version)) {
    waiter.kv_source = -1;  // keys and values of weights a reload replaced: of no use to these
  }
  Job job = InferJobFor(model, worker, waiter);
  job.generate = std::move(waiter.generate);
  job.embed = std::move(waiter.embed);
  job.stepwise = true;
  // In the worker's channel: the request, and for embeddings the reply's vectors too.
  job.frame_bytes = job.generate ? job.generate->ByteSizeLong() + job.sent_tokens.size() * sizeof(int32_t)
                                 : job.embed->ByteSizeLong() + EmbedReplyBytes(job.embed->input_size(),
                                                                               models_[model].entry.embedding_size);
  v1::WorkerEnvelope message;
  v1::WorkerInfer* infer = message.mutable_infer();
  for (const v1::Fault& f : GrantFaults(job)) *infer->add_faults() = f;
  const uint64_t id = NewJob(std::move(job));
  const Job& stored = jobs_[id];
  // A generation that was running when a worker died runs alone from then on (as a batched
  // inference does): a crash it causes again is charged to it, not shared with the others.
  infer->set_batch(stored.generate && stored.crashes == 0 && stored.shared_crashes == 0);
  StartInferJob(model, id, infer);
  // Copied into the frame: the job keeps its request for a retry.
  if (stored.generate) *infer->mutable_generate() = *stored.generate;
  // Resumed: the engine goes on after what the client has (and the chunks go on being numbered
  // from where they stopped: the job's count starts at the waiter's).
  infer->mutable_resume_tokens()->Add(stored.sent_tokens.begin(), stored.sent_tokens.end());
  if (stored.generate && stored.generate->tools_size() > 0) infer->set_tool_call_format(models_[model].tool_call_format);
  if (stored.embed) *infer->mutable_embed() = *stored.embed;
  // Retried after its worker died: that replica's KV cache goes with it (core/kv_caches.cc).
  infer->set_kv_source(stored.kv_source >= 0);
  if (auto source = kv_sources_.find(stored.kv_source); source != kv_sources_.end()) {
    infer->set_kv_source_bytes(source->second.bytes);  // a device region's handle has no size of its own
  }
  // What the client has, the core can resume after (job.resumable: a stream without tools, whose
  // chunks are tokens), or the client has nothing yet (no stream): its engine may preempt it.
  infer->set_preemptible(stored.generate && (stored.resumable || !stored.generate->stream()));
  infer->set_arrival_ms(stored.call.accepted_ms);
  Send(worker, message, stored.kv_source >= 0 ? std::vector<int>{stored.kv_source} : std::vector<int>{});
}

void Core::OnInferChunk(uint32_t slot, const v1::WorkerInferChunk& chunk) {
  Job* job = FindJob(chunk.job());
  if (job == nullptr || job->worker != slot || job->kind != Job::Kind::kInfer || !job->stepwise ||
      (!job->generate && chunk.has_chunk())) {
    return KillWorker(slot, fmt::format("sent a chunk of job {}, which is not a generation it runs", chunk.job()));
  }
  job->progress_ms = MonoMs();  // a step: the job is alive; a heartbeat has no chunk
  if (job->epoch == models_[job->model].epoch) NoteKvUsage(job->model, slot, chunk.kv_usage());
  if (chunk.has_chunk()) job->kv_source = -1;  // its engine opened it: the dead replica's cache was read
  if (!chunk.has_chunk() || job->answered || !job->generate->stream()) return;
  v1::Envelope reply;
  v1::GenerateChunk* out = reply.mutable_generate_chunk();
  *out = chunk.chunk();
  out->set_index(job->chunks++);  // the core numbers them: in order, whatever the worker says
  if (job->resumable) {
    // What it resumes after, if its worker dies: bounded by the context (a worker that sends more
    // tokens than a generation can hold is not believed), and never after a chunk of text alone.
    const uint64_t context = models_[job->model].entry.context;
    if (out->tokens_size() == 0 || job->sent_tokens.size() + out->tokens_size() > context + 1) {
      job->resumable = false;
      job->sent_tokens = {};
    } else {
      job->sent_tokens.insert(job->sent_tokens.end(), out->tokens().begin(), out->tokens().end());
    }
  }
  SendChunk(job->call, std::move(reply));
}

void Core::SendChunk(const Call& call, v1::Envelope&& chunk) {
  if (sessions_.find(call.session) == sessions_.end()) return;  // gone: nobody to tell
  chunk.set_request_id(call.request_id);
  actions_.push_back(action::Reply{call.session, std::move(chunk)});
}

void Core::AnswerGenerate(Job& job, v1::WorkerInferDone& done) {
  if (done.has_error()) {
    return AnswerError(job.call, Status(CodeFromInt(done.error().code()), done.error().message()));
  }
  v1::Envelope reply;
  v1::GenerateReply* final = reply.mutable_generate_reply();
  *final = std::move(*done.mutable_generate());
  final->set_chunks(job.chunks);
  Answer(job.call, std::move(reply));
}

bool Core::RequeueKvRefused(Job& job, const v1::WorkerInferDone& done) {
  Model& m = models_[job.model];
  // A registration replaced meanwhile (a reload) answers it: that slot may be another model's now.
  if (!job.generate || job.answered || job.epoch != m.epoch) return false;
  if (sessions_.find(job.call.session) == sessions_.end()) return false;  // nobody waits for it
  if (GenerationsOn(job.model, job.worker) == 0) return false;  // no room comes there by waiting
  // Preempted mid-stream (engine ABI version 13) after a chunk it cannot resume after (text alone):
  // going on would send its client text again. The worker was told it could not be (preemptible).
  if (job.chunks > 0 && !job.resumable) return false;
  // A retry after a crash (one that was not running then still shares its engine's steps) stays one.
  Waiter w{job.call, true, std::move(job.request), job.deadline_ms, job.crashes, job.shared_crashes, job.retry};
  w.generate = std::move(job.generate);
  if (w.generate) w.prefix_keys = PrefixKeys(*w.generate);  // remembered where it goes next
  w.chunks = job.chunks;
  w.sent_tokens = std::move(job.sent_tokens);
  w.resume_epoch = job.epoch;
  w.resume_version = m.entry.version;
  w.kv_source = job.kv_source;  // not read: nothing of it was opened
  // 0 for one handed back behind a refused one (never tried): it waits behind that one, and then
  // goes wherever there is a sequence free.
  w.kv_blocks = done.kv_blocks();
  w.refused_as = job.refused_as != 0 ? job.refused_as : ++kv_refusals_;
  // Among its kind (retries after a crash, which stay in front, or the rest), ahead of every one
  // that was not refused (all came after it: each kind is sent in order), behind those refused
  // before it.
  auto at = std::find_if(m.waiters.begin(), m.waiters.end(), [&](const Waiter& other) {
    if (other.retry != w.retry) return !other.retry;
    return other.refused_as == 0 || other.refused_as > w.refused_as;
  });
  m.waiters.insert(at, std::move(w));
  queued_++;
  if (done.kv_blocks() > 0) shm::StatAdd(segment_.model_stats(job.model).kv_cache_waits);
  if (done.kv_preempted()) shm::StatAdd(segment_.model_stats(job.model).kv_cache_preemptions);
  return true;
}

void Core::CountGeneration(const Job& job, const v1::WorkerInferDone& done) {
  // Whoever still waits for it (a client that left, a deadline passed): the tokens were made.
  if (done.has_error()) return;
  shm::ModelStats& stats = segment_.model_stats(job.model);
  const v1::GenerateReply& r = done.generate();
  shm::StatAdd(stats.prompt_tokens, r.prompt_tokens());
  shm::StatAdd(stats.prompt_tokens_cached, r.cached_prompt_tokens());
  shm::StatAdd(stats.generation_tokens, r.completion_tokens());
  // A retry's wait began before a worker died; a resumed stream's client had its first token long
  // before this job, whose count includes the tokens it resumed after.
  if (r.completion_tokens() == 0 || job.retry || job.resumed) return;
  // Waiting in the daemon (its millisecond clock), then on the worker until the first token.
  const uint64_t waited_ns = (job.started_ms - std::min(job.started_ms, job.call.accepted_ms)) * 1'000'000;
  shm::Observe(stats.first_token_seconds, waited_ns + r.first_token_us() * 1'000);
  if (r.completion_tokens() >= 2 && r.generate_us() > r.first_token_us()) {
    shm::Observe(stats.time_per_output_token_seconds,
                 (r.generate_us() - r.first_token_us()) * 1'000 / (r.completion_tokens() - 1));
  }
}

void Core::CancelGenerations(uint64_t session) {
  for (auto& [id, job] : jobs_) {
    if (job.kind != Job::Kind::kInfer || !job.stepwise || job.call.session != session) continue;
    if (job.generate && !job.answered && job.epoch == models_[job.model].epoch) {
      shm::StatAdd(segment_.model_stats(job.model).generations_cancelled);
    }
    v1::WorkerEnvelope cancel;
    cancel.mutable_cancel()->set_job(id);
    Send(job.worker, cancel);
  }
}

}  // namespace warmpool::supervisor
