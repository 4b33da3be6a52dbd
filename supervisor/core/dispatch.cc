// Inference: requests queue per model, in arrival order, until the model is ready and a replica's
// worker has room in its window (policy::PickReplica); then they go to that worker. The request
// stays with its job so that, if the worker dies while holding it, it is run once more elsewhere
// (inference is pure).
#include <algorithm>

#include "supervisor/core/core.h"

namespace warmpool::supervisor {

using namespace residency;

void Core::Enqueue(uint32_t model, Waiter&& waiter) {
  Model& m = models_[model];
  if (waiter.call.session != 0) m.asked = true;  // a preload (session 0) is nobody's request
  m.waiters.push_back(std::move(waiter));
  queued_++;
  if (m.machine.Serving()) return DrainReady(model);
  TryAdmit(model);  // loads, unparks, or attaches held weights to a worker
}

void Core::DrainReady(uint32_t model) {
  Model& m = models_[model];
  std::vector<uint32_t> serving = m.machine.ServingWorkers();
  if (serving.empty() || m.changing()) return;
  std::vector<policy::WorkerView> views;
  const policy::Window window{kWorkerWindowJobs, kWorkerWindowBytes};
  // A worker runs what it is sent in order. Requests retried after a worker died go to each worker
  // one at a time: had they all gone at once, everything sent after them would wait for every one
  // (a burst of retries after a crash is as long as the dead worker's whole window). New requests
  // go before the retries still waiting, but only into a short window (kPassingRetryJobs): each
  // retry, in turn, then waits behind a few of them, not behind a full window each time, and a
  // request sent after a crash waits for no retry it finds waiting, only for one already running.
  const policy::Window passing{kPassingRetryJobs, kWorkerWindowBytes};
  const bool retry_waits = std::any_of(m.waiters.begin(), m.waiters.end(), [](const Waiter& w) { return w.retry; });
  auto retry_waits_for_room = [&] {
    return std::any_of(m.waiters.begin(), m.waiters.end(), [](const Waiter& w) { return w.retry && w.refused_as != 0; });
  };
  auto send = [&](size_t i, uint32_t worker) {
    Waiter w = std::move(m.waiters[i]);
    m.waiters.erase(m.waiters.begin() + static_cast<ptrdiff_t>(i));
    queued_--;
    if (!w.retry && w.refused_as == 0) {  // a refused one's wait was observed when it was first sent
      shm::Observe(segment_.model_stats(model).queue_seconds,
                   (MonoMs() - w.call.accepted_ms) * 1'000'000);
    }
    // What it may need is spoken for there from now on, as far as this core knows, until the
    // replica says again (WithKvRoom).
    if (auto said = kv_usage_.find({model, worker}); said != kv_usage_.end() && w.kv_blocks > 0) {
      said->second.reserved = std::min(said->second.blocks, said->second.reserved + w.kv_blocks);
    }
    if (w.generate && !w.prefix_keys.empty()) prefix_homes_.Remember(model, w.prefix_keys, worker);
    uint64_t bytes = records::RequestDataBytes(w.infer);
    Dispatch(model, worker, std::move(w));
    views[worker].outstanding++;
    views[worker].pending_bytes += bytes;
  };
  // Retries, in their order, one per worker that runs none.
  auto send_retries = [&] {
    if (views.empty()) views = WorkerLoads();
    for (size_t i = 0; i < m.waiters.size();) {
      if (!m.waiters[i].retry) {
        ++i;
        continue;
      }
      std::vector<uint32_t> free_of_retries;
      const Waiter& retry = m.waiters[i];
      for (uint32_t slot : retry.generate ? WithKvRoom(model, WithFreeSequences(model, serving), retry.kv_blocks)
                                          : serving) {
        if (workers_[slot].retries == 0) free_of_retries.push_back(slot);
      }
      const uint32_t worker = policy::PickReplica(views, free_of_retries, window);
      if (worker == policy::kNone) return;  // each waits for its turn
      send(i, worker);
    }
  };
  // A retry a replica's KV cache had no room for goes first, and no new generation passes it while
  // it waits: they would take the room it waits for.
  if (retry_waits_for_room()) send_retries();
  const bool no_generation_passes = retry_waits_for_room();
  // Then the new requests (and loads that came while the model was being attached), in order.
  for (size_t i = 0; i < m.waiters.size();) {
    Waiter& front = m.waiters[i];
    if (front.retry) {
      ++i;
      continue;
    }
    if (!front.is_infer) {  // a load that came while it was being attached
      Waiter w = std::move(front);
      m.waiters.erase(m.waiters.begin() + static_cast<ptrdiff_t>(i));
      queued_--;
      v1::Envelope reply = LoadReplyFor(model, w.replicas_asked, {});
      reply.mutable_load_reply()->set_already_loaded(true);
      Answer(w.call, std::move(reply));
      continue;
    }
    if (front.generate && no_generation_passes) {  // embeddings and loads behind it may go
      ++i;
      continue;
    }
    if (views.empty()) views = WorkerLoads();
    // A generation takes one of the generations its replica's engine runs at once: one more waits
    // here, where it can still go to whichever replica ends one first, or time out.
    // One a replica's KV cache had no room for goes only where there is room now, and nothing
    // passes it meanwhile. A prompt that begins as an earlier one did prefers where that went.
    const policy::Window& open = retry_waits ? passing : window;
    const uint32_t worker =
        front.generate ? policy::PickReplicaPreferring(
                             views, WithKvRoom(model, WithFreeSequences(model, serving), front.kv_blocks), open,
                             prefix_homes_.Find(model, front.prefix_keys))
                       : policy::PickReplica(views, serving, open);
    if (worker == policy::kNone) break;  // a finished job drains it again
    send(i, worker);
  }
  if (retry_waits) send_retries();  // then the others
}

uint32_t Core::GenerationsOn(uint32_t model, uint32_t worker) const {
  uint32_t running = 0;
  for (const auto& [id, job] : jobs_) {
    running += job.kind == Job::Kind::kInfer && job.generate && job.model == model && job.worker == worker;
  }
  return running;
}

std::vector<uint32_t> Core::WithFreeSequences(uint32_t model, const std::vector<uint32_t>& serving) const {
  const Model& m = models_[model];
  const Ready* ready = m.machine.As<Ready>();
  const uint32_t sequences = std::max<uint32_t>(ready != nullptr ? ready->weights.sequences : 1, 1);
  std::vector<uint32_t> free;
  for (uint32_t slot : serving) {
    if (GenerationsOn(model, slot) < sequences) free.push_back(slot);
  }
  return free;
}

std::vector<uint32_t> Core::WithKvRoom(uint32_t model, const std::vector<uint32_t>& replicas, uint64_t blocks) const {
  // Each replica with the blocks free of what its generations may need, as it last said (none said:
  // 0); one that runs none of the model's generations has its whole cache free for this one (an
  // engine keeps at least one context's room), whatever it said last.
  std::vector<std::pair<uint32_t, uint64_t>> room;
  for (uint32_t slot : replicas) {
    const auto said = kv_usage_.find({model, slot});
    const uint64_t free = GenerationsOn(model, slot) == 0 ? UINT64_MAX
                          : said == kv_usage_.end()       ? 0
                                                          : said->second.blocks - said->second.reserved;
    if (blocks == 0 || free >= blocks) room.emplace_back(slot, free);
  }
  // The most room first: of replicas equally busy, policy::PickReplica takes the first.
  std::stable_sort(room.begin(), room.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  std::vector<uint32_t> slots;
  for (const auto& [slot, free] : room) slots.push_back(slot);
  return slots;
}

void Core::Dispatch(uint32_t model, uint32_t worker, Waiter&& waiter) {
  if (waiter.generate || waiter.embed) return DispatchLanguageJob(model, worker, std::move(waiter));
  if (waiter.infer.inputs_size() > 0) return DispatchTyped(model, worker, std::move(waiter));
  Model& m = models_[model];
  const Weights& weights = m.machine.As<Ready>()->weights;
  const v1::Tensor& input = waiter.infer.input();
  if (weights.in_features != 0 && input.cols() != weights.in_features) {
    return AnswerError(waiter.call, Error(Code::kInvalidArgument,
                                          "input has {} columns but model \"{}\" expects {}",
                                          input.cols(), m.entry.name, weights.in_features));
  }
  uint64_t out_cols = weights.out_features != 0 ? weights.out_features : input.cols();
  const uint64_t output_bytes = uint64_t{input.rows()} * out_cols * sizeof(float);
  // Tensors in the client's regions: their descriptors go with the frame (the region may have
  // been removed while the request waited). The output goes there when it fits, else in the reply.
  const v1::InferRequest& request = waiter.infer;
  const bool output_in_region =
      request.has_output_region() && output_bytes <= request.output_region().bytes();
  std::vector<int> handles;
  uint64_t input_region_bytes = 0, output_region_bytes = 0;  // what the worker maps of each
  if (request.has_input_region()) {
    auto region = FindRegion(waiter.call.session, request.input_region(), "input_region");
    if (!region.ok()) return AnswerError(waiter.call, region.status());
    handles.push_back((*region)->handle);
    input_region_bytes = (*region)->bytes;
  }
  if (output_in_region) {
    auto region = FindRegion(waiter.call.session, request.output_region(), "output_region");
    if (!region.ok()) return AnswerError(waiter.call, region.status());
    handles.push_back((*region)->handle);
    output_region_bytes = (*region)->bytes;
  }
  const uint64_t reply_bytes = output_in_region ? 0 : output_bytes;
  if (reply_bytes + 1024 > config_.max_frame_bytes) {
    return AnswerError(waiter.call, Error(Code::kInvalidArgument,
                                          "the output of {} rows would take {} bytes, over the "
                                          "frame limit of {}: send fewer rows per request",
                                          input.rows(), reply_bytes, config_.max_frame_bytes));
  }
  Job job = InferJobFor(model, worker, waiter);
  job.request = std::move(waiter.infer);
  job.frame_bytes = job.request.input().data().size() + reply_bytes;
  v1::WorkerEnvelope message;
  v1::WorkerInfer* infer = message.mutable_infer();
  for (const v1::Fault& f : GrantFaults(job)) *infer->add_faults() = f;
  uint64_t id = NewJob(std::move(job));
  const Job& stored = jobs_[id];
  if (m.max_batch_delay_us > 0 && stored.crashes == 0 && stored.shared_crashes == 0 && handles.empty()) {
    // Worth waiting for company only when there is some: others in flight, or queued behind.
    // A request that was running when a worker died runs alone from then on, so that a crash it
    // causes is its own and is charged to it alone (and an innocent one is not charged again).
    // Tensors in regions are large: they run alone, in place.
    // Nor when this request fills the worker's window: nothing more is sent to it before it
    // answers, so the company could not come (the worker stops waiting at such a request).
    infer->set_batch(true);
    const bool window_has_room = workers_[worker].outstanding < kWorkerWindowJobs;
    const bool company_queued = std::any_of(m.waiters.begin(), m.waiters.end(),
                                            [](const Waiter& w) { return !w.retry; });
    if (window_has_room && (m.inflight > 0 || company_queued)) infer->set_batch_delay_us(m.max_batch_delay_us);
  }
  StartInferJob(model, id, infer);
  // The input is borrowed by the message while it is serialised (one copy, into the frame) and
  // stays with the job for a retry.
  infer->unsafe_arena_set_allocated_input(const_cast<v1::Tensor*>(&stored.request.input()));
  if (stored.request.has_input_region()) {
    *infer->mutable_input_region() = stored.request.input_region();
    infer->mutable_input_region()->set_region_bytes(input_region_bytes);
  }
  if (output_in_region) {
    *infer->mutable_output_region() = stored.request.output_region();
    infer->mutable_output_region()->set_region_bytes(output_region_bytes);
  }
  Send(worker, message, std::move(handles));
  (void)infer->unsafe_arena_release_input();
}

// Typed tensors: alone on the worker (their shapes are the engine's to judge), judged by their
// steps as embeddings are (a run over a long prompt goes in pieces), the outputs bounded by a
// reply's frame, which only the worker can count.
void Core::DispatchTyped(uint32_t model, uint32_t worker, Waiter&& waiter) {
  Job job = InferJobFor(model, worker, waiter);
  job.request = std::move(waiter.infer);
  job.frame_bytes = records::RequestDataBytes(job.request);
  job.stepwise = true;
  v1::WorkerEnvelope message;
  v1::WorkerInfer* infer = message.mutable_infer();
  for (const v1::Fault& f : GrantFaults(job)) *infer->add_faults() = f;
  infer->set_max_output_bytes(config_.max_frame_bytes - std::min<uint64_t>(config_.max_frame_bytes / 2, 1024));
  const uint64_t id = NewJob(std::move(job));
  StartInferJob(model, id, infer);
  // The inputs are lent to the message while it is serialised, and stay with the job for a retry.
  v1::InferRequest& kept = jobs_[id].request;
  infer->mutable_inputs()->Swap(kept.mutable_inputs());
  Send(worker, message, {});
  infer->mutable_inputs()->Swap(kept.mutable_inputs());
}

Core::Job Core::InferJobFor(uint32_t model, uint32_t worker, const Waiter& waiter) const {
  Job job{.kind = Job::Kind::kInfer, .worker = worker, .model = model};
  job.call = waiter.call;
  job.deadline_ms = waiter.deadline_ms;
  job.crashes = waiter.crashes;
  job.shared_crashes = waiter.shared_crashes;
  job.retry = waiter.retry;
  job.chunks = waiter.chunks;
  job.resumed = waiter.chunks > 0;
  job.sent_tokens = waiter.sent_tokens;
  job.kv_source = waiter.kv_source;
  job.refused_as = waiter.refused_as;
  job.resumable = waiter.generate && waiter.generate->stream() && waiter.generate->tools_size() == 0;
  return job;
}

void Core::StartInferJob(uint32_t model, uint64_t id, v1::WorkerInfer* infer) {
  Model& m = models_[model];
  m.inflight++;
  index_->Update(model, [&](shm::ModelRecord& r) {
    r.inflight = m.inflight;
    r.hits++;
  });
  m.expires_at_ms = 0;  // busy: the clock restarts when it is idle again
  index_->Touch(model);
  infer->set_job(id);
  infer->set_model(model);
  infer->set_request_id(id);
  const Job& job = jobs_[id];
  if (job.deadline_ms != 0) {
    int64_t left = static_cast<int64_t>(job.deadline_ms) - static_cast<int64_t>(MonoMs());
    infer->set_deadline_unix_ms(UnixMs() + std::max<int64_t>(left, 0));
  }
}

void Core::OnInferDone(Job& job, v1::WorkerInferDone& done) {
  if (job.generate && job.epoch == models_[job.model].epoch) CountGeneration(job, done);
  if (job.generate && job.epoch == models_[job.model].epoch) NoteKvUsage(job.model, job.worker, done.kv_usage());
  if (done.kv_full() && RequeueKvRefused(job, done)) {
    // Back in the queue, unanswered: it goes again where a replica's cache has room.
  } else if (!job.answered && job.generate) {
    AnswerGenerate(job, done);
  } else if (!job.answered && job.embed) {
    AnswerEmbed(job, done);
  } else if (!job.answered) {
    if (done.has_error()) {
      AnswerError(job.call, Status(CodeFromInt(done.error().code()), done.error().message()));
    } else {
      v1::Envelope reply;
      if (done.has_output()) reply.mutable_infer_reply()->set_allocated_output(done.release_output());
      reply.mutable_infer_reply()->mutable_outputs()->Swap(done.mutable_outputs());
      reply.mutable_infer_reply()->set_batch_rows(done.batch_rows());
      reply.mutable_infer_reply()->set_output_in_region(done.output_in_region());
      Answer(job.call, std::move(reply));
    }
  }
  const uint32_t model = job.model;
  const bool current = job.epoch == models_[model].epoch;
  if (current) DoneOnCurrent(model);
  // Room in this worker again: other models it serves may have requests waiting for it (a
  // retry waits for exactly this: its worker's previous retry to end). A stale job's model too.
  for (uint32_t other : index_->LruOrder()) {  // the least recently used first
    if ((other != model || !current) && !models_[other].waiters.empty() &&
        models_[other].machine.HasWorker(job.worker)) {
      DrainReady(other);
    }
  }
  if (current && models_[model].inflight == 0 && !pending_admission_.empty()) RetryPending();  // an idle model may go now
}

void Core::DoneOnCurrent(uint32_t model) {
  Model& m = models_[model];
  m.inflight--;
  index_->Update(model, [&](shm::ModelRecord& r) {
    r.inflight = m.inflight;
    r.last_used_ns = now_.unix_ns;
  });
  policy::Forgive(m.crashes, MonoMs(), RetrySettings());
  if (m.inflight == 0) {
    if (m.machine.Is<Releasing>()) SendRelease(model);  // the unload waited for this request
    else StartKeepAlive(model);
  }
  DrainReady(model);
}

void Core::StartKeepAlive(uint32_t model) {
  Model& m = models_[model];
  int64_t keep = m.keep_alive_override_ms.value_or(m.keep_alive_ms);
  // keep_alive 0 is "released when its requests end": with none yet (a preload, weights adopted
  // across a restart) there is nothing to end, and it stays until its first request has.
  if (keep == 0 && !m.asked) keep = -1;
  m.expires_at_ms = keep < 0 ? 0 : std::max<uint64_t>(1, MonoMs() + static_cast<uint64_t>(keep));
}

}  // namespace warmpool::supervisor
