// What workers report: a job's end (load, attach, unpark, unload, park; inference is in
// dispatch.cc), progress, a fault's firing. A reply is matched to its job, and the job to the
// model's state: a reply that the state no longer expects (the model moved on meanwhile) changes
// nothing but the handles it brought, which are closed.
#include <algorithm>
#include <utility>

#include "common/units.h"
#include "ipc/file_version_proto.h"
#include "supervisor/core/core.h"

namespace warmpool::supervisor {

using namespace residency;

void Core::OnWorkerMessage(event::WorkerMessage&& e) {
  const uint32_t slot = e.slot;
  v1::WorkerEnvelope& message = e.message;
  if (workers_[slot].device_lost) {
    // Killed because its device's memory died: whatever it loaded lives in dead memory.
    for (int h : e.handles) Close(h);
    return;
  }
  // A load's reply may carry its engine's KV cache region after the weights', and a park's the host
  // copy of a GPU's pool after the weights' (ipc/descriptors.h).
  KeptKvCache cache;
  if (message.has_load_done() && message.load_done().cache_shared() && !e.handles.empty()) {
    cache = {e.handles.back(), message.load_done().cache_bytes(), message.load_done().cache_grant() != 0};
    e.handles.pop_back();
  } else if (message.has_park_done() && message.park_done().cache_copy() && e.handles.size() >= 2) {
    cache = {e.handles.back(), message.park_done().cache_copy_bytes(), false};
    e.handles.pop_back();
  }
  int handle = e.handles.empty() ? -1 : e.handles.front();
  for (size_t i = 1; i < e.handles.size(); i++) Close(e.handles[i]);
  uint64_t id = 0;
  switch (message.body_case()) {
    case v1::WorkerEnvelope::kLoadProgress: {
      Close(handle);
      Job* job = FindJob(message.load_progress().job());
      if (job == nullptr || job->worker != slot || job->epoch != models_[job->model].epoch) return;
      job->progress_ms = MonoMs();
      index_->Update(job->model, [&](shm::ModelRecord& r) {
        r.loaded_bytes = message.load_progress().done_bytes();
      });
      return;
    }
    case v1::WorkerEnvelope::kFaultFired: Close(handle); return OnFaultFired(message.fault_fired());
    case v1::WorkerEnvelope::kInferChunk: Close(handle); return OnInferChunk(slot, message.infer_chunk());
    case v1::WorkerEnvelope::kLoadDone: id = message.load_done().job(); break;
    case v1::WorkerEnvelope::kInferDone: id = message.infer_done().job(); break;
    case v1::WorkerEnvelope::kUnloadDone: id = message.unload_done().job(); break;
    case v1::WorkerEnvelope::kParkDone: id = message.park_done().job(); break;
    default:
      Close(handle);
      Log(LogLevel::kWarn, "worker {} sent an unexpected message ({})", slot,
          static_cast<int>(message.body_case()));
      return;
  }
  auto it = jobs_.find(id);
  if (it == jobs_.end() || it->second.worker != slot) {
    Log(LogLevel::kWarn, "worker {} answered unknown job {}", slot, id);
    Close(cache.handle);
    return Close(handle);
  }
  Job job = std::move(it->second);
  jobs_.erase(it);
  JobDone(job);
  bool load_like = job.kind == Job::Kind::kLoad || job.kind == Job::Kind::kAttach ||
                   job.kind == Job::Kind::kUnpark;
  bool expected = (load_like && message.has_load_done()) ||
                  (job.kind == Job::Kind::kInfer && message.has_infer_done()) ||
                  (job.kind == Job::Kind::kUnload && message.has_unload_done()) ||
                  (job.kind == Job::Kind::kPark && message.has_park_done());
  if (!expected) {
    Close(handle);
    Close(cache.handle);
    return KillWorker(slot, fmt::format("answered job {} with the wrong kind of message", id));
  }
  if (job.kind == Job::Kind::kInfer) return OnInferDone(job, *message.mutable_infer_done());
  if (job.epoch != models_[job.model].epoch) {  // the model was re-registered
    Close(cache.handle);
    return Close(handle);
  }
  switch (job.kind) {
    case Job::Kind::kLoad: OnLoadDone(job, message.load_done(), handle); break;
    case Job::Kind::kAttach:
      Close(handle);
      OnAttachDone(job, message.load_done());
      break;
    case Job::Kind::kUnpark: OnUnparkDone(job, message.load_done(), handle); break;
    case Job::Kind::kUnload:
      Close(handle);
      OnUnloadDone(job, id);
      break;
    case Job::Kind::kPark: OnParkDone(job, message.park_done(), handle, cache); break;
    case Job::Kind::kInfer: break;
  }
  KeepReplicaCache(job.model, slot, cache);  // held if the reply made a replica there, else closed
  if (message.has_load_done()) NoteKvUsage(job.model, slot, message.load_done().kv_usage());
}

WeightsDescription Core::LoadedWeights(uint32_t model, const v1::WorkerLoadDone& done) const {
  WeightsDescription read = FromWire(done.weights());
  if (done.weights().has_file_version()) return read;
  // A report without one (a test's or the simulator's worker): the same header is taken for the
  // registered file; another one is a version not known here (zero, which a warm restart never
  // adopts).
  const ModelEntry& entry = models_[model].entry;
  if (read.header.empty() || read.header == entry.header) read.version = entry.version;
  return read;
}

void Core::FollowFile(uint32_t model, const WeightsDescription& now) {
  Model& m = models_[model];
  static_cast<WeightsDescription&>(m.entry) = now;
  m.machine.SetRegisteredBytes(now.weight_bytes);
}

void Core::OnLoadDone(const Job& job, const v1::WorkerLoadDone& done, int handle) {
  const uint32_t model = job.model;
  Model& m = models_[model];
  const Loading* loading = m.machine.As<Loading>();
  if (loading == nullptr || loading->job != done.job()) return Close(handle);
  const std::string name = m.entry.name;
  if (done.file_changed()) {
    // The file is not what admission counted (it changed since it was registered, or while it was
    // read): it is registered as it is now and admitted again, for what it really needs.
    Close(handle);
    const WeightsDescription now = LoadedWeights(model, done);
    FollowFile(model, now);
    m.machine.AbandonLoad();
    Log(LogLevel::kInfo, "the file of \"{}\" changed: it needs {} now; admitting it again", name,
        FormatBytes(now.weight_bytes + now.workspace_bytes));
    TryAdmit(model);
    return RetryPending();
  }
  if (done.has_error()) {
    Close(handle);
    Status cause(CodeFromInt(done.error().code()), done.error().message());
    m.machine.AbandonLoad();
    Log(LogLevel::kWarn, "loading \"{}\" failed: {}", name, cause.ToString());
    // The version that failed was replaced meanwhile: its waiters wait for the new one.
    if (m.changing()) return RetryPending();
    if (cause.code() == Code::kResourceExhausted) {
      // Not the model's fault: no cooldown, the next request tries again.
      FailWaiters(model, Error(Code::kResourceExhausted, "model \"{}\" did not fit: {}", name,
                               cause.message()));
    } else {
      MarkFailed(model, cause.message(), IsFileProblem(cause));
    }
    return RetryPending();
  }
  // The weights are described by what the worker read, not by the registration: if the file
  // changed since, this is the version now served (and registered), so that a reload compares the
  // file with what is served.
  Weights w{LoadedWeights(model, done)};
  w.handle = done.weights_shared() ? handle : -1;
  if (!done.weights_shared()) Close(handle);
  if (done.weights_shared() && handle < 0) {
    Log(LogLevel::kError, "worker {} announced shared weights but sent none", job.worker);
  }
  if (!w.header.empty() && (w.header != m.entry.header || w.version != m.entry.version)) {
    Log(LogLevel::kInfo, "\"{}\" loaded a newer version of its file than was registered", name);
    FollowFile(model, w);
  }
  if (w.header.empty()) {  // an engine without a file: the registration says what it is
    w.header = m.entry.header;
    w.file_size = m.entry.file_size;
  }
  m.entry.workspace_bytes = w.workspace_bytes;  // what the next admission counts
  m.entry.sequences = w.sequences;              // ... of this many generations' caches
  m.entry.kv_tokens = w.kv_tokens;              // ... of this many positions in all
  // ... of this many bytes each: the element the engine keeps its cache in (bf16 or f32), as
  // registration chose it too (a registration of an older daemon, kept across a restart, counted
  // f32). A report of an older worker may not say.
  if (w.kv_bytes_per_token != 0) m.entry.kv_bytes_per_token = w.kv_bytes_per_token;
  // What an embed reply's frame bound counts (a registration from a manifest of an older daemon
  // may not say).
  if (w.embedding_size != 0) m.entry.embedding_size = w.embedding_size;
  // Whether it generates at all: what its engine said (a plugin's is known only now).
  m.entry.embeds_only = w.embeds_only;
  // What `models` shows of the tensors it takes: known once a worker has opened it.
  m.entry.runs_tensors = w.runs_tensors;
  m.entry.inputs = w.inputs;
  m.entry.outputs = w.outputs;
  m.machine.FinishLoad(std::move(w));
  CountLoad(model, shm::LoadSource::kFile, job.started_ms);
  OnReady(model, job.started_ms, "loaded");
}

void Core::OnAttachDone(const Job& job, const v1::WorkerLoadDone& done) {
  const uint32_t model = job.model;
  Model& m = models_[model];
  const std::vector<Replica>* replicas = m.machine.Replicas();
  bool expected = replicas != nullptr &&
                  std::any_of(replicas->begin(), replicas->end(), [&](const Replica& r) {
                    return r.worker == job.worker && r.attach_job == done.job();
                  });
  if (!expected) return;
  if (done.has_error()) {
    Log(LogLevel::kWarn, "attaching \"{}\" to worker {} failed: {}", m.entry.name, job.worker,
        done.error().message());
    m.machine.DropReplica(job.worker);
    if (const Ready* ready = m.machine.As<Ready>(); ready != nullptr && ready->replicas.empty()) {
      // The held weights cannot be attached: let them go and load from the file instead.
      Release(model, shm::ReleaseReason::kFailure, /*allow_park=*/false, "its weights could not be attached");
    } else if (const Releasing* r = m.machine.As<Releasing>();
               r != nullptr && r->replicas.empty() && r->park_job == 0 && !r->draining) {
      FinishRelease(model);
    }
    return RetryPending();
  }
  m.machine.ReplicaAttached(job.worker);
  CountLoad(model, shm::LoadSource::kAttach, job.started_ms);
  if (!m.machine.Is<Ready>()) return;  // releasing: its unload follows in the same channel
  std::vector<uint32_t> serving = m.machine.ServingWorkers();
  if (job.moving_from != shm::kNil &&
      std::find(serving.begin(), serving.end(), job.moving_from) != serving.end()) {
    SendLeave(model, job.moving_from);  // the move is done: the crowded worker lets it go
  }
  if (serving.size() == 1) return OnReady(model, job.started_ms, "attached");
  Log(LogLevel::kInfo, "\"{}\" weights attached on worker {}: {} replicas serve it", m.entry.name,
      job.worker, serving.size());
  DrainReady(model);
  AdjustReplicas(model);  // more than its target when a second attach raced a slow first one
}

void Core::OnUnparkDone(const Job& job, const v1::WorkerLoadDone& done, int handle) {
  const uint32_t model = job.model;
  Model& m = models_[model];
  const Unparking* u = m.machine.As<Unparking>();
  if (u == nullptr || u->job != done.job()) return Close(handle);
  if (done.has_error() || !done.weights_shared() || handle < 0) {
    Close(handle);
    Log(LogLevel::kWarn, "unparking \"{}\" failed ({}); loading it from its file", m.entry.name,
        done.has_error() ? done.error().message() : std::string("no device copy came back"));
    const uint64_t copy_bytes = u->copy.weight_bytes;
    CloseMemory(m.machine.FailUnpark(), copy_bytes);
    TryAdmit(model);
    return RetryPending();
  }
  const uint64_t copy_bytes = u->copy.weight_bytes;
  // The copy's header and version are the weights' (whatever the file says now); the sizes are
  // what the worker that copied them back measured.
  Weights w = u->copy;
  w.handle = handle;
  const WeightsDescription copied = FromWire(done.weights());
  w.weight_bytes = copied.weight_bytes;
  w.workspace_bytes = copied.workspace_bytes;
  w.in_features = copied.in_features;
  w.out_features = copied.out_features;
  CloseMemory(m.machine.FinishUnpark(std::move(w)), copy_bytes);  // back on the device: the host copy goes
  CountLoad(model, shm::LoadSource::kUnpark, job.started_ms);
  OnReady(model, job.started_ms, "unparked");
}

void Core::CountLoad(uint32_t model, shm::LoadSource source, uint64_t started_ms) {
  shm::ModelStats& stats = segment_.model_stats(model);
  shm::StatAdd(stats.loads[static_cast<uint32_t>(source)]);
  // The core's clock counts milliseconds: so do these durations.
  const uint64_t ns = (MonoMs() - started_ms) * 1'000'000;
  shm::Observe(source == shm::LoadSource::kUnpark ? stats.unpark_seconds : stats.load_seconds, ns);
}

void Core::OnReady(uint32_t model, uint64_t started_ms, const char* how) {
  Model& m = models_[model];
  const Ready* ready = m.machine.As<Ready>();
  m.last_error.clear();
  m.file_broken = false;
  Log(LogLevel::kInfo, "\"{}\" ready on worker {} ({} weights {}, {} ms)", m.entry.name,
      m.machine.ServingWorkers().front(), FormatBytes(ready->weights.weight_bytes), how,
      MonoMs() - started_ms);
  // A version that was replaced while it loaded: let go after this event (ProcessRetirements);
  // its waiters, a preload among them, wait for the new one.
  if (m.changing()) return;
  StartKeepAlive(model);
  CheckPreload();
  if (!Fits(ready->weights.device, 0)) {
    // An engine allocated more than it said it would (a plugin's workspace, say).
    FailWaiters(model, Error(Code::kResourceExhausted,
                             "model \"{}\" took more memory than it announced and does not fit the "
                             "budget: unloaded",
                             m.entry.name));
    return Release(model, shm::ReleaseReason::kFailure, /*allow_park=*/false,
                   "it took more memory than it announced");
  }
  // Inference waiters go to the workers in arrival order; load waiters are answered once the
  // replicas asked for are on their way, so that the reply says how many there are.
  std::deque<Waiter> rest;
  std::vector<Waiter> loads;
  for (Waiter& w : m.waiters) {
    if (w.is_infer) {
      rest.push_back(std::move(w));
      continue;
    }
    queued_--;
    loads.push_back(std::move(w));
  }
  m.waiters.swap(rest);
  DrainReady(model);
  const std::string short_by = AdjustReplicas(model);
  for (const Waiter& w : loads) {
    v1::Envelope reply = LoadReplyFor(model, w.replicas_asked, short_by);
    reply.mutable_load_reply()->set_load_ms(MonoMs() - started_ms);
    Answer(w.call, std::move(reply));
  }
  m.evicted_for.clear();
  EnforceMaxCached(model);
  RetryPending();
}

void Core::OnUnloadDone(const Job& job, uint64_t id) {
  const uint32_t model = job.model;
  Model& m = models_[model];
  const std::vector<Replica>* replicas = m.machine.Replicas();
  // The replica's own unload: one sent before its replica was dropped (an attach that failed
  // during a release) must not take a later replica on the same worker with it.
  bool expected = replicas != nullptr &&
                  std::any_of(replicas->begin(), replicas->end(), [&](const Replica& r) {
                    return r.worker == job.worker && r.leave_job == id;
                  });
  if (!expected) return;
  KeepCacheToPark(model, job.worker);  // before the replica goes, and its cache with it
  m.machine.DropReplica(job.worker);
  if (m.machine.Is<Ready>() && m.machine.Replicas()->empty()) {
    // Its last replica left (a move or a shrink whose other replica died meanwhile): the weights
    // are held, nobody serves them; requests waiting for it get a worker to attach them.
    TryAdmit(model);
  }
  if (const Releasing* r = m.machine.As<Releasing>();
      r != nullptr && r->replicas.empty() && r->park_job == 0 && !r->draining) {
    FinishRelease(model);
  }
  RetryPending();
}

void Core::OnParkDone(const Job& job, const v1::WorkerParkDone& done, int handle, KeptKvCache& cache) {
  const uint32_t model = job.model;
  Model& m = models_[model];
  Releasing* r = m.machine.As<Releasing>();
  // The pool's host copy is this park's alone: never a replica's cache (KeepReplicaCache).
  const KeptKvCache pool_copy = std::exchange(cache, KeptKvCache{});
  if (r == nullptr || r->park_job != done.job()) {
    Close(pool_copy.handle);
    return Close(handle);
  }
  r->park_job = 0;
  if (done.has_error() || !done.copy_shared() || handle < 0) {
    Close(handle);
    Close(pool_copy.handle);
    Log(LogLevel::kWarn, "parking \"{}\" failed ({}); dropping it instead", m.entry.name,
        done.error().message());
  } else {
    Weights copy = r->weights;  // the host copy is described like the weights it copies
    copy.handle = handle;
    r->copy = std::move(copy);
    // A GPU's KV pool copied out with it (its replicas' caches are device memory, which parking
    // frees: KeepCacheToPark keeps none of them), kept as a host replica's cache would be: within
    // the park budget, counted with the copy, and not for a daemon taking over.
    if (pool_copy.handle >= 0 && r->kv_cache.handle < 0 && !handing_over_ && !r->then_failed && pool_copy.bytes > 0 &&
        ParkCommitted() + pool_copy.bytes <= config_.park_budget_bytes) {
      r->kv_cache = pool_copy;
    } else {
      Close(pool_copy.handle);
    }
  }
  if (r->replicas.empty()) FinishRelease(model);
}

}  // namespace warmpool::supervisor
