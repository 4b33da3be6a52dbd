// Inference: requests queue per model (in arrival order) until the model is ready and its worker
// has room, then go to the worker. The request is kept with its job so that, if the worker dies
// while holding it, it can be retried once elsewhere (inference is pure).
#include "ipc/framing.h"
#include "supervisor/core/core.h"

namespace warmpool::supervisor {

using shm::ModelState;

void Core::Enqueue(uint32_t model, Waiter&& waiter, bool front) {
  ModelRuntime& rt = runtime_[model];
  if (front) rt.waiters.push_front(std::move(waiter));
  else rt.waiters.push_back(std::move(waiter));
  queued_++;
  if (index_->State(model) == ModelState::kReady && index_->Get(model).worker_slot != shm::kNil) {
    DrainReady(model);
  } else {
    EnsureLoading(model);  // loads, or attaches held weights to a worker
  }
}

uint32_t Core::PickReplica(uint32_t model) const {
  uint32_t best = shm::kNil;
  for (uint32_t slot : runtime_[model].replica_slots) {
    if (workers_[slot].outstanding >= kMaxWorkerPendingJobs ||
        workers_[slot].pending_bytes >= kMaxWorkerPendingBytes) {
      continue;
    }
    if (best == shm::kNil || workers_[slot].outstanding < workers_[best].outstanding) best = slot;
  }
  return best;
}

void Core::DrainReady(uint32_t model) {
  ModelRuntime& rt = runtime_[model];
  while (!rt.waiters.empty() && index_->State(model) == ModelState::kReady && !rt.unload_when_idle &&
         index_->Get(model).worker_slot != shm::kNil) {
    if (PickReplica(model) == shm::kNil) return;  // OnInferDone drains again as workers catch up
    Waiter waiter = std::move(rt.waiters.front());
    rt.waiters.pop_front();
    queued_--;
    if (!waiter.is_infer) continue;  // load waiters are answered by OnLoadDone
    Dispatch(model, waiter);
  }
}

void Core::StartKeepAlive(uint32_t model) {
  ModelRuntime& rt = runtime_[model];
  int64_t keep = rt.keep_alive_override_ms.value_or(rt.keep_alive_ms);
  rt.expires_at_ms = keep < 0 ? 0 : MonoMs() + static_cast<uint64_t>(keep);
}

void Core::ExpireIdle(uint64_t now) {
  // Never the only warm model, never the most recently used one, never one with work in flight
  // or pinned: keep_alive trims the idle tail, it does not empty the pool.
  std::vector<uint32_t> lru = index_->LruOrder();
  if (lru.size() <= 1) return;
  for (uint32_t model : lru) {
    if (model == lru.back()) break;
    const shm::ModelRecord& r = index_->Get(model);
    uint64_t expires = runtime_[model].expires_at_ms;
    if (expires == 0 || now < expires || r.inflight != 0 || r.pinned ||
        index_->State(model) != ModelState::kReady || !runtime_[model].waiters.empty()) {
      continue;
    }
    Log(LogLevel::kInfo, "\"{}\" idle past its keep_alive; releasing it", r.name);
    runtime_[model].expires_at_ms = 0;
    Release(model, /*eviction=*/false);
  }
}

bool Core::Dispatch(uint32_t model, Waiter& waiter) {
  ModelRuntime& rt = runtime_[model];
  const shm::ModelRecord& r = index_->Get(model);
  const v1::Tensor& input = waiter.infer.input();
  if (rt.in_features != 0 && input.cols() != rt.in_features) {
    AnswerError(waiter.call, Error(Code::kInvalidArgument,
                                   "input has {} columns but model \"{}\" expects {}",
                                   input.cols(), r.name, rt.in_features));
    return false;
  }
  uint64_t out_cols = rt.out_features != 0 ? rt.out_features : input.cols();
  uint64_t reply_bytes = uint64_t{input.rows()} * out_cols * sizeof(float);
  if (reply_bytes + 1024 > config_.max_frame_bytes) {
    AnswerError(waiter.call, Error(Code::kInvalidArgument,
                                   "the output of {} rows would take {} bytes, over the frame limit "
                                   "of {}: send fewer rows per request",
                                   input.rows(), reply_bytes, config_.max_frame_bytes));
    return false;
  }
  Job job;
  job.kind = Job::Kind::kInfer;
  job.worker = PickReplica(model);  // the least busy replica (DrainReady made sure one has room)
  job.model = model;
  job.call = waiter.call;
  job.deadline_ms = waiter.deadline_ms;
  job.crashes = waiter.crashes;
  job.request = std::move(waiter.infer);
  job.bytes = job.request.input().data().size() + reply_bytes;
  uint32_t worker = job.worker;
  uint64_t id = NewJob(std::move(job));
  const Job& stored = jobs_[id];
  index_->Update(model, [](shm::ModelRecord& m) {
    m.inflight++;
    m.hits++;
  });
  rt.expires_at_ms = 0;  // busy: the clock restarts when it is idle again
  index_->Touch(model);
  // The input is borrowed by the message for serialisation (one copy, into the frame) and stays
  // with the job for a retry.
  v1::WorkerEnvelope message;
  v1::WorkerInfer* infer = message.mutable_infer();
  infer->set_job(id);
  infer->set_model(model);
  infer->set_request_id(id);
  if (stored.deadline_ms != 0) {
    int64_t left = static_cast<int64_t>(stored.deadline_ms) - static_cast<int64_t>(MonoMs());
    infer->set_deadline_unix_ms(UnixMs() + std::max<int64_t>(left, 0));
  }
  infer->unsafe_arena_set_allocated_input(const_cast<v1::Tensor*>(&stored.request.input()));
  SendToWorker(worker, message);
  (void)infer->unsafe_arena_release_input();
  return true;
}

void Core::OnInferDone(Job& job, v1::WorkerInferDone& done) {
  uint32_t model = job.model;
  ModelRuntime& rt = runtime_[model];
  index_->Update(model, [&](shm::ModelRecord& r) {
    r.inflight--;
    r.last_used_ns = now_.unix_ns;
  });
  if (!job.answered) {
    if (done.has_error()) {
      AnswerError(job.call, Status(CodeFromInt(done.error().code()), done.error().message()));
    } else {
      v1::Envelope reply;
      reply.mutable_infer_reply()->set_allocated_output(done.release_output());
      Answer(job.call, std::move(reply));
    }
  }
  // A model that served well for a whole crash window has earned its base cooldown back.
  if (!rt.crash_ms.empty() && MonoMs() - rt.crash_ms.back() > config_.crash_loop_window_ms) {
    rt.crash_ms.clear();
    rt.cooldown_ms = 0;
  }
  if (index_->Get(model).inflight == 0 && rt.unload_when_idle) {
    SendUnload(model);
    return;
  }
  if (index_->Get(model).inflight == 0) StartKeepAlive(model);
  DrainReady(model);
  // Leaving the registry: its last request ended, so its unload can start (never more than that
  // from here: see MaybeRetire).
  if (index_->Get(model).inflight == 0 && index_->State(model) == ModelState::kReady) {
    MaybeRetire(model);
  }
  // Room in this worker again: other models on it may have requests waiting for it.
  if (workers_[job.worker].outstanding + 1 >= kMaxWorkerPendingJobs ||
      workers_[job.worker].pending_bytes + job.bytes >= kMaxWorkerPendingBytes) {
    for (uint32_t other : index_->LruOrder()) {
      if (other != model && index_->Get(other).worker_slot == job.worker) DrainReady(other);
    }
  }
  if (index_->Get(model).inflight == 0 && !pending_admission_.empty()) {
    RetryPending();  // an idle model may now be evicted
  }
}

}  // namespace warmpool::supervisor
