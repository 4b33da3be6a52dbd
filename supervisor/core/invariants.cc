// The core's own invariants, across the machines, the jobs, the workers and the sessions: what
// the simulator checks after every event (the segment's invariants are shm::Validate's).
#include <algorithm>
#include <map>

#include "ipc/framing.h"
#include "supervisor/core/core.h"

namespace warmpool::supervisor {

using namespace residency;

Status Core::CheckInvariants() const {
  // Kept memory is memory the budget promised: used + kept never passes it, and a kept region is
  // no model's (each counted once).
  if (kept_memory_.size() != 0) {
    const uint64_t used = index_->DeviceUsed(0), budget = index_->DeviceBudget(0);
    if (used + kept_memory_.bytes() > budget) {
      return Error(Code::kInternal, "device 0 uses {} and keeps {} bytes, over its budget of {}", used,
                   kept_memory_.bytes(), budget);
    }
    if (!KeepsFreedMemory() || handing_over_) {
      return Error(Code::kInternal, "{} regions kept where nothing may be", kept_memory_.size());
    }
    for (const auto& [model, handle] : HeldHandles()) {
      for (const KeptMemory::Region& r : kept_memory_.regions()) {
        if (r.handle == handle) return Error(Code::kInternal, "handle {} is kept and held at once", handle);
      }
    }
  }
  size_t regions = 0;
  for (const auto& [id, session] : sessions_) regions += session.regions.size();
  if (regions != regions_ || regions_ > kMaxRegions) {
    return Error(Code::kInternal, "{} client regions held, {} counted (at most {})", regions, regions_, kMaxRegions);
  }
  // KV caches (core/kv_caches.cc): a replica's while its worker serves the model, a dead one's
  // while a retried generation names it, none both.
  for (const auto& [replica, cache] : replica_caches_) {
    const uint32_t model = replica.first, worker = replica.second;
    const std::vector<Replica>* replicas = models_[model].machine.Replicas();
    if (replicas == nullptr ||
        std::none_of(replicas->begin(), replicas->end(), [&](const Replica& r) { return r.worker == worker; })) {
      return Error(Code::kInternal, "the KV cache of \"{}\" on worker {} is held, but no replica is there",
                   models_[model].entry.name, worker);
    }
    if (kv_sources_.contains(cache.handle)) {
      return Error(Code::kInternal, "KV cache {} is a replica's and a source", cache.handle);
    }
  }
  std::set<int> named;
  for (const auto& [id, job] : jobs_) {
    if (job.kv_source >= 0) named.insert(job.kv_source);
  }
  for (const Model& m : models_) {
    for (const Waiter& w : m.waiters) {
      if (w.kv_source >= 0) named.insert(w.kv_source);
    }
  }
  std::set<int> sources;
  for (const auto& [handle, source] : kv_sources_) sources.insert(handle);
  if (named != sources) {
    return Error(Code::kInternal, "{} KV cache sources held, {} named by retried generations", kv_sources_.size(),
                 named.size());
  }
  uint64_t infer_jobs = 0;
  for (const auto& [id, job] : jobs_) infer_jobs += job.kind == Job::Kind::kInfer;
  if (infer_jobs != infer_jobs_) {
    return Error(Code::kInternal, "{} inference jobs, {} counted", infer_jobs, infer_jobs_);
  }
  std::map<uint32_t, uint32_t> file_loads, infers;
  std::vector<uint32_t> outstanding(workers_.size(), 0);
  std::vector<uint64_t> pending(workers_.size(), 0);
  std::vector<uint32_t> retries(workers_.size(), 0);
  for (const auto& [id, job] : jobs_) {
    outstanding[job.worker]++;
    retries[job.worker] += job.retry ? 1 : 0;
    pending[job.worker] += job.frame_bytes;
    bool current = job.epoch == models_[job.model].epoch;
    if (!current) continue;
    if (job.kind == Job::Kind::kLoad && ++file_loads[job.model] > 1) {
      return Error(Code::kInternal, "two file loads of \"{}\" at once", models_[job.model].entry.name);
    }
    if (job.kind == Job::Kind::kInfer) infers[job.model]++;
  }
  for (uint32_t slot = 0; slot < workers_.size(); slot++) {
    if (workers_[slot].outstanding != outstanding[slot] || workers_[slot].pending_bytes != pending[slot]) {
      return Error(Code::kInternal, "worker {} counts {} jobs ({} bytes) but has {} ({} bytes)", slot,
                   workers_[slot].outstanding, workers_[slot].pending_bytes, outstanding[slot],
                   pending[slot]);
    }
    // Retried requests go one at a time to a worker, so that new ones never queue behind several.
    if (workers_[slot].retries != retries[slot] || retries[slot] > 1) {
      return Error(Code::kInternal, "worker {} counts {} retried requests but has {} (at most 1)", slot,
                   workers_[slot].retries, retries[slot]);
    }
  }
  auto job_is = [&](uint64_t id, Job::Kind kind, uint32_t worker, uint32_t model) {
    auto it = jobs_.find(id);
    return it != jobs_.end() && it->second.kind == kind && it->second.worker == worker &&
           it->second.model == model && it->second.epoch == models_[model].epoch;
  };
  uint32_t queued = 0;
  for (uint32_t model : index_->All()) {
    const Model& m = models_[model];
    const std::string& name = m.entry.name;
    queued += static_cast<uint32_t>(m.waiters.size());
    if (m.inflight != infers[model]) {
      return Error(Code::kInternal, "\"{}\" counts {} requests in flight but has {}", name,
                   m.inflight, infers[model]);
    }
    const ModelMachine& machine = m.machine;
    if (const Loading* l = machine.As<Loading>(); l && DeviceOf(l->worker) != l->device) {
      return Error(Code::kInternal, "\"{}\" loads for device {} on worker {}", name, l->device, l->worker);
    }
    if (const Unparking* u = machine.As<Unparking>(); u && DeviceOf(u->worker) != u->device) {
      return Error(Code::kInternal, "\"{}\" unparks for device {} on worker {}", name, u->device, u->worker);
    }
    if (const Loading* l = machine.As<Loading>(); l && !job_is(l->job, Job::Kind::kLoad, l->worker, model)) {
      return Error(Code::kInternal, "\"{}\" is loading on worker {} with no such job", name, l->worker);
    }
    if (const Unparking* u = machine.As<Unparking>(); u && !job_is(u->job, Job::Kind::kUnpark, u->worker, model)) {
      return Error(Code::kInternal, "\"{}\" is unparking on worker {} with no such job", name, u->worker);
    }
    if (const Releasing* r = machine.As<Releasing>(); r && r->park_job != 0 &&
        std::none_of(r->replicas.begin(), r->replicas.end(), [&](const Replica& x) {
          return job_is(r->park_job, Job::Kind::kPark, x.worker, model);
        })) {
      return Error(Code::kInternal, "\"{}\" waits for a park job that no replica runs", name);
    }
    if (const std::vector<Replica>* replicas = machine.Replicas()) {
      if (replicas->size() > config_.workers_per_device) {
        return Error(Code::kInternal, "\"{}\" has {} replicas on a device of {} workers", name,
                     replicas->size(), config_.workers_per_device);
      }
      std::vector<uint32_t> seen;
      const uint32_t device = machine.DeviceWeights()->device;
      for (const Replica& r : *replicas) {
        if (DeviceOf(r.worker) != device) {
          return Error(Code::kInternal, "\"{}\" is on device {} with a replica on worker {} of device {}",
                       name, device, r.worker, DeviceOf(r.worker));
        }
        if (std::find(seen.begin(), seen.end(), r.worker) != seen.end()) {
          return Error(Code::kInternal, "\"{}\" counts worker {} twice among its replicas", name, r.worker);
        }
        seen.push_back(r.worker);
        if (workers_[r.worker].state != WorkerSlot::State::kUp) {
          return Error(Code::kInternal, "\"{}\" has a replica on worker {}, which is not up", name, r.worker);
        }
        if (r.attach_job != 0 && !job_is(r.attach_job, Job::Kind::kAttach, r.worker, model)) {
          return Error(Code::kInternal, "\"{}\" attaches on worker {} with no such job", name, r.worker);
        }
        if (r.leave_job != 0 && !job_is(r.leave_job, Job::Kind::kUnload, r.worker, model)) {
          return Error(Code::kInternal, "\"{}\" leaves worker {} with no such job", name, r.worker);
        }
      }
    }
    if (const Weights* w = machine.DeviceWeights(); w && w->weight_bytes > 0 && w->handle < 0) {
      return Error(Code::kInternal, "\"{}\" is resident with no weights held", name);
    }
    if (const Parked* p = machine.As<Parked>(); p && p->copy.handle < 0) {
      return Error(Code::kInternal, "\"{}\" is parked with no host copy held", name);
    }
    if (machine.Is<Ready>() && m.inflight > 0 && !machine.Serving() &&
        std::none_of(machine.Replicas()->begin(), machine.Replicas()->end(),
                     [](const Replica& r) { return r.leave_job != 0; })) {
      return Error(Code::kInternal, "\"{}\" has requests in flight and no replica", name);
    }
  }
  if (queued != queued_) {
    return Error(Code::kInternal, "{} requests counted as waiting, {} waiting", queued_, queued);
  }
  uint32_t unanswered = 0;
  uint64_t held = 0;
  for (const auto& [id, s] : sessions_) {
    unanswered += s.outstanding;
    held += s.held_bytes;
    if (s.held_bytes > config_.max_queued_bytes_per_connection) {
      return Error(Code::kInternal, "session {} holds {} bytes, over its budget", id, s.held_bytes);
    }
  }
  if (unanswered != unanswered_ || held != held_bytes_) {
    return Error(Code::kInternal, "sessions hold {} requests ({} bytes), counted {} ({} bytes)",
                 unanswered, held, unanswered_, held_bytes_);
  }
  if (held_bytes_ > config_.max_queued_bytes) {
    return Error(Code::kInternal, "{} bytes of requests held, over the budget", held_bytes_);
  }
  return OkStatus();
}

Status action::CheckAllocation(const SendToWorker& send) {
  if (send.allocates == 0) return OkStatus();
  v1::WorkerEnvelope message;
  if (send.frame.size() < ipc::kFramePrefixBytes ||
      !message.ParseFromArray(send.frame.data() + ipc::kFramePrefixBytes,
                              static_cast<int>(send.frame.size() - ipc::kFramePrefixBytes))) {
    return Error(Code::kInternal, "an allocating frame for worker {} does not parse", send.slot);
  }
  uint64_t job = 0;
  if (message.has_load()) {
    job = message.load().job();
    if (send.allocates > message.load().admitted_bytes()) {
      return Error(Code::kInternal, "the load of \"{}\" (job {}) allocates {} bytes, more than the {} admitted",
                   message.load().name(), job, send.allocates, message.load().admitted_bytes());
    }
  } else if (message.has_attach()) {
    job = message.attach().job();
    if (!message.attach().copy() || send.allocates != message.attach().weights().weight_bytes()) {
      return Error(Code::kInternal, "the {} of \"{}\" (job {}) allocates {} bytes for {} bytes of weights",
                   message.attach().copy() ? "unpark" : "attach", message.attach().name(), job, send.allocates,
                   message.attach().weights().weight_bytes());
    }
  } else if (message.has_park()) {
    job = message.park().job();
  } else {
    return Error(Code::kInternal, "a frame for worker {} allocates {} bytes but starts no load, unpark or park",
                 send.slot, send.allocates);
  }
  if (job != send.job) {
    return Error(Code::kInternal, "a frame for worker {} allocates for job {} but starts job {}", send.slot,
                 send.job, job);
  }
  return OkStatus();
}

}  // namespace warmpool::supervisor
