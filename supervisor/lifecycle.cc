// Model lifecycle driven by the daemon: registered -> loading -> ready -> unloading -> registered,
// plus failed. Each transition is one call on the index (the single writer), made here.
#include <spdlog/spdlog.h>

#include "common/clock.h"
#include "common/units.h"
#include "supervisor/daemon.h"

namespace warmpool::supervisor {

using shm::ModelState;

uint64_t Daemon::NewJob(Job job) {
  uint64_t id = next_job_++;
  job.started_ms = MonotonicMillis();
  worker_outstanding_[job.worker]++;
  jobs_.emplace(id, job);
  return id;
}

void Daemon::EnsureLoading(uint32_t model) {
  ModelState state = index_->State(model);
  if (state == ModelState::kRegistered || state == ModelState::kFailed) TryAdmit(model);
  // loading: the waiters ride on that load; unloading: reloaded when the unload completes.
}

void Daemon::TryAdmit(uint32_t model) {
  ModelState state = index_->State(model);
  if (state != ModelState::kRegistered && state != ModelState::kFailed) return;
  if (runtime_[model].waiters.empty()) return;  // everyone gave up meanwhile
  const uint64_t bytes = index_->Get(model).weight_bytes + runtime_[model].workspace_bytes;
  AdmissionPlan plan = PlanAdmission(*index_, model, /*device=*/0, bytes, limits_);
  auto wait = [&] {
    for (uint32_t m : pending_admission_) {
      if (m == model) return;
    }
    pending_admission_.push_back(model);
  };
  switch (plan.kind) {
    case AdmissionPlan::Kind::kAdmit: {
      uint32_t worker = PickWorkerForLoad(workers_->Loads(worker_models_, worker_outstanding_));
      if (worker == shm::kNil) return wait();  // no worker ready yet: on_ready retries
      StartLoad(model, worker, bytes);
      return;
    }
    case AdmissionPlan::Kind::kEvict:
      for (uint32_t victim : plan.victims) {
        spdlog::info("evicting \"{}\" to make room for \"{}\"", index_->Get(victim).name,
                     index_->Get(model).name);
        StartUnload(victim, /*eviction=*/true);
      }
      return wait();
    case AdmissionPlan::Kind::kWait:
      return wait();
    case AdmissionPlan::Kind::kReject:
      FailWaiters(model, plan.reason);
      return;
  }
}

void Daemon::RetryPending() {
  // Admission may start unloads whose completion calls back here; one pass at a time.
  if (retrying_ || stopping_) return;
  retrying_ = true;
  std::deque<uint32_t> pending;
  pending.swap(pending_admission_);
  for (uint32_t model : pending) TryAdmit(model);
  retrying_ = false;
}

void Daemon::StartLoad(uint32_t model, uint32_t worker, uint64_t bytes) {
  const shm::ModelRecord& r = index_->Get(model);
  index_->MarkLoading(model, /*device=*/0, worker, bytes);
  worker_models_[worker]++;
  Job job;
  job.kind = Job::Kind::kLoad;
  job.worker = worker;
  job.model = model;
  uint64_t id = NewJob(job);
  v1::WorkerEnvelope message;
  v1::WorkerLoad* load = message.mutable_load();
  load->set_job(id);
  load->set_model(model);
  load->set_name(r.name);
  load->set_engine(r.engine);
  load->set_path(r.path);
  spdlog::info("loading \"{}\" ({}) on worker {}", r.name, FormatBytes(bytes), worker);
  // A worker that is not ready is dying: its death handler fails this job.
  workers_->Send(worker, message);
}

void Daemon::StartUnload(uint32_t model, bool eviction) {
  if (index_->State(model) != ModelState::kReady) return;
  index_->MarkUnloading(model);
  if (eviction) index_->Update(model, [](shm::ModelRecord& r) { r.evictions++; });
  if (index_->Get(model).inflight == 0) {
    SendUnload(model);
  } else {
    runtime_[model].unload_when_idle = true;  // OnInferDone sends it when the last request ends
  }
}

void Daemon::SendUnload(uint32_t model) {
  runtime_[model].unload_when_idle = false;
  Job job;
  job.kind = Job::Kind::kUnload;
  job.worker = index_->Get(model).worker_slot;
  job.model = model;
  uint64_t id = NewJob(job);
  v1::WorkerEnvelope message;
  message.mutable_unload()->set_job(id);
  message.mutable_unload()->set_model(model);
  workers_->Send(job.worker, message);
}

void Daemon::Dispatch(uint32_t model, Waiter&& waiter) {
  ModelRuntime& rt = runtime_[model];
  const shm::ModelRecord& r = index_->Get(model);
  const v1::Tensor& input = waiter.infer.input();
  if (rt.in_features != 0 && input.cols() != rt.in_features) {
    AnswerError(waiter.call, Error(Code::kInvalidArgument,
                                   "input has {} columns but model \"{}\" expects {}",
                                   input.cols(), r.name, rt.in_features));
    return;
  }
  Job job;
  job.kind = Job::Kind::kInfer;
  job.worker = r.worker_slot;
  job.model = model;
  job.call = waiter.call;
  job.deadline_ms = waiter.deadline_ms;
  uint64_t id = NewJob(job);
  index_->Update(model, [](shm::ModelRecord& m) {
    m.inflight++;
    m.hits++;
  });
  index_->Touch(model);
  v1::WorkerEnvelope message;
  v1::WorkerInfer* infer = message.mutable_infer();
  infer->set_job(id);
  infer->set_model(model);
  infer->set_request_id(waiter.call.request_id);
  infer->set_deadline_unix_ms(UnixMillis() + static_cast<int64_t>(waiter.deadline_ms - MonotonicMillis()));
  infer->set_allocated_input(waiter.infer.release_input());
  workers_->Send(job.worker, message);
}

void Daemon::FailWaiters(uint32_t model, const Status& status) {
  std::deque<Waiter> waiters;
  waiters.swap(runtime_[model].waiters);
  queued_ -= static_cast<uint32_t>(waiters.size());
  for (Waiter& w : waiters) AnswerError(w.call, status);
}

void Daemon::OnWorkerMessage(uint32_t slot, v1::WorkerEnvelope&& message) {
  uint64_t id = 0;
  switch (message.body_case()) {
    case v1::WorkerEnvelope::kLoadProgress: {
      auto it = jobs_.find(message.load_progress().job());
      if (it == jobs_.end()) return;
      index_->Update(it->second.model, [&](shm::ModelRecord& r) {
        r.loaded_bytes = message.load_progress().done_bytes();
      });
      return;
    }
    case v1::WorkerEnvelope::kLoadDone: id = message.load_done().job(); break;
    case v1::WorkerEnvelope::kInferDone: id = message.infer_done().job(); break;
    case v1::WorkerEnvelope::kUnloadDone: id = message.unload_done().job(); break;
    default:
      spdlog::warn("worker {} sent an unexpected message ({})", slot,
                   static_cast<int>(message.body_case()));
      return;
  }
  auto it = jobs_.find(id);
  if (it == jobs_.end() || it->second.worker != slot) {
    spdlog::warn("worker {} answered unknown job {}", slot, id);
    return;
  }
  Job job = it->second;
  jobs_.erase(it);
  worker_outstanding_[slot]--;
  switch (job.kind) {
    case Job::Kind::kLoad: OnLoadDone(job, message.load_done()); break;
    case Job::Kind::kInfer: OnInferDone(job, *message.mutable_infer_done()); break;
    case Job::Kind::kUnload: OnUnloadDone(job); break;
  }
}

void Daemon::OnLoadDone(const Job& job, const v1::WorkerLoadDone& done) {
  uint32_t model = job.model;
  ModelRuntime& rt = runtime_[model];
  const std::string name = index_->Get(model).name;
  if (done.has_error()) {
    Status cause(CodeFromInt(done.error().code()), done.error().message());
    index_->MarkNotResident(model, ModelState::kFailed, cause.message());
    rt.last_error = cause.message();
    worker_models_[job.worker]--;
    spdlog::warn("loading \"{}\" failed: {}", name, cause.ToString());
    Code code = cause.code() == Code::kResourceExhausted ? Code::kResourceExhausted
                                                          : Code::kFailedPrecondition;
    FailWaiters(model, Error(code, "model \"{}\" failed to load: {} (fix it, then 'warmpool load {}')",
                             name, cause.message(), name));
    RetryPending();
    return;
  }
  rt.last_error.clear();
  rt.workspace_bytes = done.workspace_bytes();
  rt.in_features = done.in_features();
  rt.out_features = done.out_features();
  index_->MarkReady(model, done.weight_bytes(), done.workspace_bytes());
  spdlog::info("\"{}\" ready on worker {} ({} weights, {} ms)", name, job.worker,
               FormatBytes(done.weight_bytes()), MonotonicMillis() - job.started_ms);
  std::deque<Waiter> waiters;
  waiters.swap(rt.waiters);
  queued_ -= static_cast<uint32_t>(waiters.size());
  for (Waiter& w : waiters) {
    if (w.is_infer) {
      Dispatch(model, std::move(w));
    } else {
      v1::Envelope reply;
      reply.mutable_load_reply()->set_model(name);
      reply.mutable_load_reply()->set_bytes(done.weight_bytes());
      reply.mutable_load_reply()->set_load_ms(MonotonicMillis() - job.started_ms);
      Answer(w.call, std::move(reply));
    }
  }
  RetryPending();
}

void Daemon::OnInferDone(Job& job, v1::WorkerInferDone& done) {
  uint32_t model = job.model;
  index_->Update(model, [](shm::ModelRecord& r) {
    r.inflight--;
    r.last_used_ns = UnixNanos();
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
  if (index_->Get(model).inflight == 0) {
    if (runtime_[model].unload_when_idle) SendUnload(model);
    else if (!pending_admission_.empty()) RetryPending();  // an idle model may now be evicted
  }
}

void Daemon::OnUnloadDone(const Job& job) {
  uint32_t model = job.model;
  index_->MarkNotResident(model, ModelState::kRegistered, "");
  worker_models_[job.worker]--;
  std::vector<Call> waiters;
  waiters.swap(runtime_[model].unload_waiters);
  for (const Call& call : waiters) {
    v1::Envelope reply;
    reply.mutable_unload_reply()->set_model(index_->Get(model).name);
    Answer(call, std::move(reply));
  }
  if (!runtime_[model].waiters.empty()) EnsureLoading(model);  // requests came in meanwhile
  RetryPending();
}

void Daemon::OnWorkerDeath(uint32_t slot, uint32_t generation, const std::string& why) {
  uint32_t reclaimed = inflight_->Reclaim(static_cast<uint16_t>(slot), generation);
  if (reclaimed != 0) spdlog::info("reclaimed {} in-flight markers of worker {}", reclaimed, slot);
  const Status lost = Error(Code::kUnavailable, "worker {} {} while serving the request; retry it",
                            slot, why);
  // Jobs first (they reference models), in job order so replies keep arrival order.
  std::vector<uint64_t> ids;
  for (const auto& [id, job] : jobs_) {
    if (job.worker == slot) ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end());
  for (uint64_t id : ids) {
    Job job = jobs_[id];
    jobs_.erase(id);
    worker_outstanding_[slot]--;
    switch (job.kind) {
      case Job::Kind::kInfer:
        index_->Update(job.model, [](shm::ModelRecord& r) { r.inflight--; });
        if (!job.answered) AnswerError(job.call, lost);
        break;
      case Job::Kind::kLoad:
      case Job::Kind::kUnload:
        break;  // the model is handled below with the others resident there
    }
  }
  for (uint32_t model : index_->LruOrder()) {
    const shm::ModelRecord& r = index_->Get(model);
    if (r.worker_slot != slot) continue;
    bool was_loading = index_->State(model) == ModelState::kLoading;
    index_->MarkNotResident(model, ModelState::kRegistered,
                            fmt::format("worker {} {}", slot, why));
    runtime_[model].unload_when_idle = false;
    std::vector<Call> unload_waiters;
    unload_waiters.swap(runtime_[model].unload_waiters);
    for (const Call& call : unload_waiters) {
      v1::Envelope reply;  // the memory is gone with the process: the unload happened
      reply.mutable_unload_reply()->set_model(r.name);
      Answer(call, std::move(reply));
    }
    if (was_loading) FailWaiters(model, lost);
  }
  worker_models_[slot] = 0;
  RetryPending();
}

void Daemon::SweepDeadlines() {
  uint64_t now = MonotonicMillis();
  for (uint32_t model : index_->All()) {
    std::deque<Waiter>& waiters = runtime_[model].waiters;
    for (auto it = waiters.begin(); it != waiters.end();) {
      if (it->deadline_ms != 0 && now > it->deadline_ms) {
        Call call = it->call;
        it = waiters.erase(it);
        queued_--;
        AnswerError(call, Error(Code::kDeadlineExceeded,
                                "model \"{}\" was not ready before the request's deadline",
                                index_->Get(model).name));
      } else {
        ++it;
      }
    }
  }
  for (auto& [id, job] : jobs_) {
    if (job.kind != Job::Kind::kInfer || job.answered || job.deadline_ms == 0) continue;
    if (now > job.deadline_ms) {
      job.answered = true;  // the worker's late reply is dropped
      AnswerError(job.call, Error(Code::kDeadlineExceeded,
                                  "inference on \"{}\" did not finish before the deadline",
                                  index_->Get(job.model).name));
    }
  }
}

}  // namespace warmpool::supervisor
