// Model lifecycle driven by the daemon: registered -> loading -> ready -> unloading -> registered,
// plus failed. Each transition is one call on the index (the single writer), made here.
#include <algorithm>

#include "common/units.h"
#include "supervisor/core/core.h"

namespace warmpool::supervisor {

using shm::ModelState;

uint64_t Core::NewJob(Job&& job) {
  uint64_t id = next_job_++;
  job.started_ms = MonoMs();
  job.progress_ms = job.started_ms;
  workers_[job.worker].outstanding++;
  workers_[job.worker].pending_bytes += job.bytes;
  jobs_.emplace(id, std::move(job));
  return id;
}

void Core::EnsureLoading(uint32_t model) {
  ModelState state = index_->State(model);
  bool detached = state == ModelState::kReady && index_->Get(model).worker_slot == shm::kNil;
  if (state == ModelState::kRegistered || state == ModelState::kFailed || detached ||
      state == ModelState::kParked) {
    TryAdmit(model);
  }
  // loading: the waiters ride on that load; unloading: reloaded when the unload completes;
  // ready: DrainReady serves them.
}

void Core::TryAdmit(uint32_t model) {
  ModelState state = index_->State(model);
  if (runtime_[model].waiters.empty()) return;  // everyone gave up meanwhile
  // A path refused at registration (outside the model roots, not a regular file) never reaches a
  // worker: only a reload can fix it.
  if (!runtime_[model].refused.ok()) return FailWaiters(model, runtime_[model].refused);
  auto wait = [&] {
    for (uint32_t m : pending_admission_) {
      if (m == model) return;
    }
    pending_admission_.push_back(model);
  };
  if (state == ModelState::kReady && index_->Get(model).worker_slot == shm::kNil) {
    // Resident weights, no worker serving them: attach them to one, no file read.
    uint32_t worker = PickWorkerForLoad(Loads());
    if (worker == shm::kNil) return wait();
    return StartAttach(model, worker);
  }
  if (state != ModelState::kRegistered && state != ModelState::kFailed &&
      state != ModelState::kParked) {
    return;
  }
  if (state == ModelState::kFailed) {
    if (MonoMs() < runtime_[model].failed_until_ms) {
      FailWaiters(model, FailedStatus(model));
      return;
    }
    // Cooldown over: look at the file again, it may have been fixed (or replaced). Through the
    // model roots again first: what is there now may be a symlink leading out, or a FIFO. Looking
    // is I/O: the shell does it and answers with event::ModelInspected.
    ModelRuntime& rt = runtime_[model];
    if (!rt.inspected) {
      const shm::ModelRecord& r = index_->Get(model);
      if (!rt.inspecting) actions_.push_back(action::InspectModel{model, r.name, r.engine, r.path});
      rt.inspecting = true;
      return;
    }
  }
  const uint64_t bytes = index_->Get(model).weight_bytes + runtime_[model].workspace_bytes;
  AdmissionPlan plan = PlanAdmission(*index_, model, /*device=*/0, bytes, limits_);
  switch (plan.kind) {
    case AdmissionPlan::Kind::kAdmit: {
      uint32_t worker = PickWorkerForLoad(Loads());
      if (worker != shm::kNil && state == ModelState::kParked) return StartUnpark(model, worker, bytes);
      if (worker != shm::kNil) return StartLoad(model, worker, bytes);
      if (!AnyCanServe()) {
        FailWaiters(model, Error(Code::kUnavailable,
                                 "no worker is running (they exited with status 2, fatal "
                                 "configuration): see the daemon log"));
        return;
      }
      return wait();  // workers are (re)starting: on_ready retries
    }
    case AdmissionPlan::Kind::kEvict: {
      bool freed_now = false;
      for (uint32_t victim : plan.victims) {
        Log(LogLevel::kInfo, "evicting \"{}\" to make room for \"{}\"", index_->Get(victim).name,
            index_->Get(model).name);
        Release(victim, /*eviction=*/true);
        freed_now = freed_now || !shm::OnDevice(index_->State(victim));
      }
      // Detached victims are released at once (no worker to ask): plan again with the room made.
      if (freed_now) return TryAdmit(model);
      return wait();
    }
    case AdmissionPlan::Kind::kWait:
      return wait();
    case AdmissionPlan::Kind::kReject:
      FailWaiters(model, plan.reason);
      return;
  }
}

void Core::OnModelInspected(const event::ModelInspected& inspected) {
  uint32_t model = inspected.model;
  ModelRuntime& rt = runtime_[model];
  if (!rt.inspecting || index_->State(model) != ModelState::kFailed ||
      inspected.path != index_->Get(model).path) {
    return;  // the model changed meanwhile (re-registered, forgotten): the answer is stale
  }
  rt.inspecting = false;
  const shm::ModelRecord& r = index_->Get(model);
  if (r.path[0] != '\0') {
    if (!inspected.resolved.ok() || *inspected.resolved != r.path) {
      MarkFailed(model, inspected.resolved.ok()
                            ? fmt::format("model path {} leads to {} now; reload to register it "
                                          "again",
                                          r.path, *inspected.resolved)
                            : inspected.resolved.status().message());
      FailWaiters(model, FailedStatus(model));
      return;
    }
  }
  const ModelEntry& entry = inspected.entry;
  if (!entry.problem.ok()) {
    MarkFailed(model, entry.problem.message());
    FailWaiters(model, FailedStatus(model));
    return;
  }
  index_->Update(model, [&](shm::ModelRecord& m) { m.weight_bytes = entry.weight_bytes; });
  rt.workspace_bytes = entry.workspace_bytes;
  rt.header = entry.header;
  rt.file_size = entry.file_size;
  rt.in_features = entry.in_features;
  rt.out_features = entry.out_features;
  rt.inspected = true;  // admission may go on: the next load uses what was found
  TryAdmit(model);
}

void Core::RetryPending() {
  // Admission may start unloads whose completion calls back here; one pass at a time.
  // During the drain too: accepted requests waiting for room still get it. Not once it has ended.
  if (retrying_ || drain_ended_) return;
  retrying_ = true;
  std::deque<uint32_t> pending;
  pending.swap(pending_admission_);
  for (uint32_t model : pending) TryAdmit(model);
  retrying_ = false;
  for (uint32_t model : index_->LruOrder()) {
    if (runtime_[model].replica_slots.size() < runtime_[model].target_replicas) GrowReplicas(model);
  }
}

void Core::StartLoad(uint32_t model, uint32_t worker, uint64_t bytes) {
  const shm::ModelRecord& r = index_->Get(model);
  runtime_[model].inspected = false;
  index_->MarkLoading(model, /*device=*/0, worker, bytes);
  workers_[worker].models++;
  Job job;
  job.kind = Job::Kind::kLoad;
  job.worker = worker;
  job.model = model;
  uint64_t id = NewJob(std::move(job));
  v1::WorkerEnvelope message;
  v1::WorkerLoad* load = message.mutable_load();
  load->set_job(id);
  load->set_model(model);
  load->set_name(r.name);
  load->set_engine(r.engine);
  load->set_path(r.path);
  Log(LogLevel::kInfo, "loading \"{}\" ({}) on worker {}", r.name, FormatBytes(bytes), worker);
  // A worker that is not ready is dying: its death handler fails this job.
  SendToWorker(worker, message);
}

void Core::StartAttach(uint32_t model, uint32_t worker, bool extra_replica) {
  if (!extra_replica) index_->MarkAttaching(model, worker);  // an extra replica: still ready
  Log(LogLevel::kInfo, "attaching the resident weights of \"{}\" to worker {}",
      index_->Get(model).name, worker);
  SendAttach(model, worker, extra_replica, /*unpark=*/false);
}

void Core::SendAttach(uint32_t model, uint32_t worker, bool extra_replica, bool unpark) {
  const shm::ModelRecord& r = index_->Get(model);
  const ModelRuntime& rt = runtime_[model];
  workers_[worker].models++;
  Job job;
  job.kind = Job::Kind::kLoad;
  job.attach = true;
  job.extra_replica = extra_replica;
  job.unpark = unpark;
  job.worker = worker;
  job.model = model;
  uint64_t id = NewJob(std::move(job));
  // The region travels with the frame: the device weights, or for an unpark the host copy.
  int region = unpark ? rt.park_fd : rt.weights_fd;
  v1::WorkerEnvelope message;
  v1::WorkerAttach* attach = message.mutable_attach();
  attach->set_job(id);
  attach->set_model(model);
  attach->set_name(r.name);
  attach->set_engine(r.engine);
  attach->set_path(r.path);
  attach->set_header(rt.header);
  attach->set_file_size(rt.file_size);
  attach->set_weight_bytes(region >= 0 ? r.weight_bytes : 0);
  attach->set_copy(unpark);
  SendToWorker(worker, message, region >= 0 ? std::vector<int>{region} : std::vector<int>{});
}

void Core::GrowReplicas(uint32_t model) {
  ModelRuntime& rt = runtime_[model];
  if (index_->State(model) != ModelState::kReady || rt.replica_slots.empty() || stopping_) return;
  std::vector<uint32_t> busy = rt.replica_slots;  // serving it, or attaching it now
  for (const auto& [id, job] : jobs_) {
    if (job.model == model && job.extra_replica) busy.push_back(job.worker);
  }
  while (busy.size() < rt.target_replicas) {
    std::vector<WorkerLoad> loads = Loads();
    for (WorkerLoad& w : loads) {
      if (std::find(busy.begin(), busy.end(), w.slot) != busy.end()) w.alive = false;
    }
    uint32_t worker = PickWorkerForLoad(loads);
    if (worker == shm::kNil) return;  // fewer workers than replicas: on_ready grows it later
    uint64_t budget = index_->DeviceBudget();
    if (budget != 0 && index_->DeviceUsed(0) + rt.workspace_bytes > budget) {
      // Room for the replica's workspace comes like room for a load: idle models LRU first.
      PoolLimits bytes_only;
      AdmissionPlan plan = PlanAdmission(*index_, model, /*device=*/0, rt.workspace_bytes, bytes_only);
      if (plan.kind == AdmissionPlan::Kind::kEvict) {
        for (uint32_t victim : plan.victims) Release(victim, /*eviction=*/true);
      }
      if (index_->DeviceUsed(0) + rt.workspace_bytes > budget) return;  // RetryPending grows it
    }
    StartAttach(model, worker, /*extra_replica=*/true);
    busy.push_back(worker);
  }
}

void Core::DropWeights(uint32_t model) {
  CloseHandle(runtime_[model].weights_fd);
  runtime_[model].weights_fd = -1;
}

void Core::FinishUnload(uint32_t model) {
  DropWeights(model);
  ModelRuntime& rt = runtime_[model];
  rt.replica_slots.clear();
  rt.unloads_pending = 0;
  // An unload that was waiting for the last request ends here too when a worker's death ended it
  // first; left set, it would keep the next load's requests from ever being dispatched.
  rt.unload_when_idle = false;
  bool parked = rt.parking && rt.park_fd >= 0 && index_->State(model) == ModelState::kUnloading;
  rt.parking = false;
  if (parked) {
    index_->MarkParked(model);
    Log(LogLevel::kInfo, "\"{}\" parked ({} in host memory)", index_->Get(model).name,
        FormatBytes(index_->Get(model).weight_bytes));
    std::vector<Call> waiters;
    waiters.swap(rt.unload_waiters);
    for (const Call& call : waiters) {
      v1::Envelope reply;
      reply.mutable_unload_reply()->set_model(index_->Get(model).name);
      Answer(call, std::move(reply));
    }
    AnswerBulk(model);
    if (!rt.waiters.empty()) EnsureLoading(model);
    return;
  }
  CloseHandle(rt.park_fd);
  rt.park_fd = -1;
  // A model failed while its unload was under way ends failed, not registered.
  bool failed = rt.failed_until_ms > MonoMs();
  index_->MarkNotResident(model, failed ? ModelState::kFailed : ModelState::kRegistered,
                          failed ? rt.last_error : "");
  std::vector<Call> waiters;
  waiters.swap(rt.unload_waiters);
  for (const Call& call : waiters) {
    v1::Envelope reply;
    reply.mutable_unload_reply()->set_model(index_->Get(model).name);
    Answer(call, std::move(reply));
  }
  AnswerBulk(model);
  // Leaving the registry (or changing): the status tick re-registers or forgets it, from a clean
  // stack. Callers up this one (a worker's death, an unload reply) may still use the index, and
  // requests retried after a death may yet be queued for it.
  if (rt.retiring) return;
  if (!rt.waiters.empty()) EnsureLoading(model);  // requests came in meanwhile
}

void Core::AnswerBulk(uint32_t model) {
  std::vector<uint64_t> ids;
  ids.swap(runtime_[model].bulk);
  bool parked = index_->State(model) == ModelState::kParked;
  for (uint64_t id : ids) {
    auto it = bulk_unloads_.find(id);
    if (it == bulk_unloads_.end()) continue;
    it->second.parked += parked ? 1 : 0;
    if (--it->second.remaining > 0) continue;
    v1::Envelope reply;
    reply.mutable_unload_reply()->set_model(fmt::format("{} model(s), {} parked", it->second.total,
                                                        it->second.parked));
    Answer(it->second.call, std::move(reply));
    bulk_unloads_.erase(it);
  }
}

bool Core::CanPark(uint32_t model) const {
  const ModelRuntime& rt = runtime_[model];
  uint64_t weights = index_->Get(model).weight_bytes;
  return rt.weights_fd >= 0 && weights > 0 && index_->ParkBudget() != 0 &&
         index_->ParkUsed() + weights <= index_->ParkBudget();
}

void Core::Release(uint32_t model, bool eviction) {
  if (index_->State(model) != ModelState::kReady) return;
  runtime_[model].parking = CanPark(model) && !runtime_[model].replica_slots.empty();
  StartUnload(model, eviction);
}

void Core::StartUnpark(uint32_t model, uint32_t worker, uint64_t bytes) {
  index_->MarkUnparking(model, worker, bytes);
  Log(LogLevel::kInfo, "unparking \"{}\" on worker {}", index_->Get(model).name, worker);
  SendAttach(model, worker, /*extra_replica=*/false, /*unpark=*/true);
}

void Core::OnParkDone(const Job& job, const v1::WorkerParkDone& done, int copy_fd) {
  ModelRuntime& rt = runtime_[job.model];
  if (done.has_error() || copy_fd < 0) {
    Log(LogLevel::kWarn, "parking \"{}\" failed ({}); dropping it instead",
        index_->Get(job.model).name, done.error().message());
    rt.parking = false;
    CloseHandle(copy_fd);
    return;
  }
  CloseHandle(rt.park_fd);
  rt.park_fd = copy_fd;
}

void Core::EnforceMaxCached(uint32_t keep) {
  if (config_.max_cached == 0) return;
  std::vector<uint32_t> lru = index_->LruOrder();
  size_t cached = lru.size();
  // Parked entries first, least recently used first, never the one just (re)loaded.
  for (uint32_t model : lru) {
    if (cached <= config_.max_cached) return;
    if (model == keep || index_->State(model) != ModelState::kParked || index_->Get(model).pinned) continue;
    CloseHandle(runtime_[model].park_fd);
    runtime_[model].park_fd = -1;
    index_->MarkNotResident(model, ModelState::kRegistered, "");
    cached--;
  }
  for (uint32_t model : lru) {
    if (cached <= config_.max_cached) return;
    const shm::ModelRecord& r = index_->Get(model);
    if (model == keep || index_->State(model) != ModelState::kReady || r.inflight != 0 || r.pinned) continue;
    runtime_[model].parking = false;  // max_cached counts parked copies too: drop
    StartUnload(model, /*eviction=*/true);
    cached--;
  }
}

void Core::StartUnload(uint32_t model, bool eviction) {
  if (index_->State(model) != ModelState::kReady) return;
  if (eviction) index_->Update(model, [](shm::ModelRecord& r) { r.evictions++; });
  if (runtime_[model].replica_slots.empty()) {
    FinishUnload(model);  // detached: no worker to ask, the weights are ours to release
    return;
  }
  index_->MarkUnloading(model);
  if (index_->Get(model).inflight == 0) {
    SendUnload(model);
  } else {
    runtime_[model].unload_when_idle = true;  // OnInferDone sends it when the last request ends
  }
}

void Core::SendUnload(uint32_t model) {
  ModelRuntime& rt = runtime_[model];
  rt.unload_when_idle = false;
  if (rt.parking && !rt.replica_slots.empty()) {
    // The primary copies the weights to host memory before it lets go of them: its channel
    // carries the park ahead of its unload.
    Job job;
    job.kind = Job::Kind::kPark;
    job.worker = rt.replica_slots.front();
    job.model = model;
    uint32_t worker = job.worker;
    uint64_t id = NewJob(std::move(job));
    v1::WorkerEnvelope message;
    message.mutable_park()->set_job(id);
    message.mutable_park()->set_model(model);
    SendToWorker(worker, message);
  }
  // Every replica lets go of its mapping; the weights go when the last one has.
  for (uint32_t worker : rt.replica_slots) {
    Job job;
    job.kind = Job::Kind::kUnload;
    job.worker = worker;
    job.model = model;
    uint64_t id = NewJob(std::move(job));
    v1::WorkerEnvelope message;
    message.mutable_unload()->set_job(id);
    message.mutable_unload()->set_model(model);
    SendToWorker(worker, message);
    rt.unloads_pending++;
  }
  if (rt.unloads_pending == 0) FinishUnload(model);
}

void Core::FailWaiters(uint32_t model, const Status& status) {
  std::deque<Waiter> waiters;
  waiters.swap(runtime_[model].waiters);
  queued_ -= static_cast<uint32_t>(waiters.size());
  for (Waiter& w : waiters) AnswerError(w.call, status);
}

void Core::OnWorkerMessage(event::WorkerMessage&& event) {
  uint32_t slot = event.slot;
  v1::WorkerEnvelope& message = event.message;
  // A successful load carries the weights region, a park its host copy: one handle each.
  int weights_fd = -1;
  int copy_fd = -1;
  if (message.has_load_done() && message.load_done().weights_shared()) {
    if (!event.handles.empty()) weights_fd = event.handles.front();
    if (weights_fd < 0) Log(LogLevel::kError, "worker {} announced shared weights but sent none", slot);
  } else if (message.has_park_done() && message.park_done().copy_shared()) {
    if (!event.handles.empty()) copy_fd = event.handles.front();
  }
  uint64_t id = 0;
  switch (message.body_case()) {
    case v1::WorkerEnvelope::kLoadProgress: {
      auto it = jobs_.find(message.load_progress().job());
      if (it == jobs_.end()) return;
      it->second.progress_ms = MonoMs();
      index_->Update(it->second.model, [&](shm::ModelRecord& r) {
        r.loaded_bytes = message.load_progress().done_bytes();
      });
      return;
    }
    case v1::WorkerEnvelope::kFaultFired: OnFaultFired(message.fault_fired().id()); return;
    case v1::WorkerEnvelope::kLoadDone: id = message.load_done().job(); break;
    case v1::WorkerEnvelope::kInferDone: id = message.infer_done().job(); break;
    case v1::WorkerEnvelope::kUnloadDone: id = message.unload_done().job(); break;
    case v1::WorkerEnvelope::kParkDone: id = message.park_done().job(); break;
    default:
      Log(LogLevel::kWarn, "worker {} sent an unexpected message ({})", slot,
          static_cast<int>(message.body_case()));
      return;
  }
  auto it = jobs_.find(id);
  if (it == jobs_.end() || it->second.worker != slot) {
    Log(LogLevel::kWarn, "worker {} answered unknown job {}", slot, id);
    CloseHandle(weights_fd);
    CloseHandle(copy_fd);
    return;
  }
  Job job = std::move(it->second);
  jobs_.erase(it);
  workers_[slot].outstanding--;
  workers_[slot].pending_bytes -= job.bytes;
  (OnLoadThread(job) ? workers_[slot].load_done_ms : workers_[slot].serving_done_ms) = MonoMs();
  switch (job.kind) {
    case Job::Kind::kLoad: OnLoadDone(job, message.load_done(), weights_fd); break;
    case Job::Kind::kInfer: OnInferDone(job, *message.mutable_infer_done()); break;
    case Job::Kind::kUnload: OnUnloadDone(job); break;
    case Job::Kind::kPark:
      OnParkDone(job, message.park_done(), copy_fd);
      break;
  }
}

void Core::OnLoadDone(const Job& job, const v1::WorkerLoadDone& done, int weights_fd) {
  uint32_t model = job.model;
  ModelRuntime& rt = runtime_[model];
  const std::string name = index_->Get(model).name;
  if (job.extra_replica) {
    workers_[job.worker].models--;
    if (done.has_error()) {
      Log(LogLevel::kWarn, "replica of \"{}\" on worker {} failed: {}", name, job.worker,
          done.error().message());
      return;
    }
    if (index_->State(model) != ModelState::kReady) {
      // Unloading (or gone) meanwhile: this replica lets go at once.
      Job unload;
      unload.kind = Job::Kind::kUnload;
      unload.worker = job.worker;
      unload.model = model;
      workers_[job.worker].models++;
      rt.replica_slots.push_back(job.worker);
      index_->AddReplica(model, rt.workspace_bytes);
      uint64_t id = NewJob(std::move(unload));
      v1::WorkerEnvelope message;
      message.mutable_unload()->set_job(id);
      message.mutable_unload()->set_model(model);
      SendToWorker(job.worker, message);
      rt.unloads_pending++;
      return;
    }
    workers_[job.worker].models++;
    rt.replica_slots.push_back(job.worker);
    index_->AddReplica(model, rt.workspace_bytes);
    Log(LogLevel::kInfo, "\"{}\" has {} replicas", name, rt.replica_slots.size());
    DrainReady(model);
    return;
  }
  if (done.has_error() && job.attach) {
    // The held weights could not be attached: let them go and load from the file instead.
    Log(LogLevel::kWarn, "attaching \"{}\" failed ({}); loading it from its file", name,
        done.error().message());
    workers_[job.worker].models--;
    DropWeights(model);
    CloseHandle(rt.park_fd);
    rt.park_fd = -1;
    index_->MarkNotResident(model, ModelState::kRegistered, done.error().message());
    EnsureLoading(model);
    RetryPending();
    return;
  }
  if (done.has_error()) {
    Status cause(CodeFromInt(done.error().code()), done.error().message());
    workers_[job.worker].models--;
    Log(LogLevel::kWarn, "loading \"{}\" failed: {}", name, cause.ToString());
    if (cause.code() == Code::kResourceExhausted) {
      // Not the model's fault: no cooldown, the next request tries again.
      index_->MarkNotResident(model, ModelState::kRegistered, cause.message());
      FailWaiters(model, Error(Code::kResourceExhausted, "model \"{}\" did not fit: {}", name,
                               cause.message()));
    } else {
      index_->MarkNotResident(model, ModelState::kRegistered, "");
      MarkFailed(model, cause.message());
      FailWaiters(model, FailedStatus(model));
    }
    RetryPending();
    return;
  }
  if (weights_fd >= 0) {
    DropWeights(model);
    rt.weights_fd = weights_fd;
  }
  if (job.unpark && rt.park_fd >= 0) {
    CloseHandle(rt.park_fd);  // back on the device: the host copy goes
    rt.park_fd = -1;
  }
  rt.last_error.clear();
  rt.workspace_bytes = done.workspace_bytes();
  rt.in_features = done.in_features();
  rt.out_features = done.out_features();
  index_->MarkReady(model, done.weight_bytes(), done.workspace_bytes());
  rt.replica_slots = {job.worker};
  StartKeepAlive(model);
  CheckPreload();
  Log(LogLevel::kInfo, "\"{}\" ready on worker {} ({} weights {}, {} ms)", name, job.worker,
      FormatBytes(done.weight_bytes()), job.attach ? "attached" : "loaded",
      MonoMs() - job.started_ms);
  uint64_t budget = index_->DeviceBudget();
  if (budget != 0 && index_->DeviceUsed(0) > budget) {
    // The engine allocated more than its header promised (the file changed since registration).
    FailWaiters(model, Error(Code::kResourceExhausted,
                             "model \"{}\" took more memory than its header announced and does not "
                             "fit the budget: unloaded; restart warmpoold if the file changed",
                             name));
    StartUnload(model, /*eviction=*/false);
    return;
  }
  // Load waiters are answered; inference waiters go to the worker in arrival order.
  std::deque<Waiter> rest;
  for (Waiter& w : rt.waiters) {
    if (w.is_infer) {
      rest.push_back(std::move(w));
      continue;
    }
    queued_--;
    v1::Envelope reply;
    reply.mutable_load_reply()->set_model(name);
    reply.mutable_load_reply()->set_bytes(done.weight_bytes());
    reply.mutable_load_reply()->set_load_ms(MonoMs() - job.started_ms);
    Answer(w.call, std::move(reply));
  }
  rt.waiters.swap(rest);
  DrainReady(model);
  GrowReplicas(model);
  EnforceMaxCached(model);
  RetryPending();
}

void Core::OnUnloadDone(const Job& job) {
  workers_[job.worker].models--;
  ModelRuntime& rt = runtime_[job.model];
  std::erase(rt.replica_slots, job.worker);
  if (rt.unloads_pending > 0) rt.unloads_pending--;
  if (rt.unloads_pending == 0) FinishUnload(job.model);
  RetryPending();
}

}  // namespace warmpool::supervisor

namespace warmpool::supervisor {

std::vector<WorkerLoad> Core::Loads() const {
  std::vector<WorkerLoad> loads;
  for (uint32_t slot = 0; slot < workers_.size(); slot++) {
    const WorkerSlot& w = workers_[slot];
    loads.push_back(WorkerLoad{slot, w.ready, w.models, w.outstanding});
  }
  return loads;
}

bool Core::AnyCanServe() const {
  for (const WorkerSlot& w : workers_) {
    if (!w.fatal) return true;
  }
  return false;
}

}  // namespace warmpool::supervisor
