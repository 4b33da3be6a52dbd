// Room: admission (policy::PlanAdmission decides, this acts), loads, unparks, releases (park or
// drop), max_cached, keep_alive. Replicas and moves are in replicas.cc. Every change of a model's
// residency goes through its machine (model.h).
#include <algorithm>

#include "common/units.h"
#include "supervisor/core/core.h"

namespace warmpool::supervisor {

using namespace residency;
using Where = policy::Resident::Where;

std::vector<policy::Resident> Core::Residents() const {
  std::vector<policy::Resident> lru;
  for (uint32_t model : index_->LruOrder()) {
    const Model& m = models_[model];
    const shm::ModelRecord& r = index_->Get(model);
    policy::Resident p;
    p.model = model;
    p.name = r.name;
    // With a dead replica's GPU pool while a retried generation holds it (kv_caches.cc).
    p.device_bytes = r.weight_bytes + r.workspace_bytes + DeviceKvSourceBytes(model);
    p.pinned = m.pinned;
    p.device = m.machine.Device() == shm::kNil ? 0 : m.machine.Device();
    p.busy = m.inflight != 0 || !m.waiters.empty() || !m.unload_waiters.empty();
    p.expires_at_ms = m.expires_at_ms;
    p.release_when_idle = m.keep_alive_override_ms.value_or(m.keep_alive_ms) == 0;
    if (m.machine.Is<Parked>()) {
      p.where = Where::kParked;
      p.device_bytes = 0;
      p.parked_bytes = r.weight_bytes + r.workspace_bytes;  // the copy and the KV cache kept with it
    } else if (m.machine.Is<Releasing>()) {
      p.where = Where::kLeaving;
    } else if (const Ready* ready = m.machine.As<Ready>()) {
      bool settling = std::any_of(ready->replicas.begin(), ready->replicas.end(),
                                  [](const Replica& x) { return !x.serving(); });
      p.where = settling ? Where::kSettling : Where::kDevice;
    } else {
      p.where = Where::kSettling;  // loading, unparking
    }
    lru.push_back(std::move(p));
  }
  return lru;
}

uint64_t Core::ParkCommitted() const {
  // Host copies count against the park budget from the moment they are decided until they are
  // let go: those being made, and those being copied back to the device (an unpark that fails
  // or whose worker dies leaves the copy parked again).
  uint64_t committed = index_->ParkUsed();
  for (uint32_t model : index_->LruOrder()) {
    const ModelMachine& machine = models_[model].machine;
    const Releasing* r = machine.As<Releasing>();
    if (r != nullptr && (r->park || r->park_job != 0 || r->copy)) committed += r->weights.weight_bytes;
    if (r != nullptr) committed += r->kv_cache.bytes;  // kept to park with the copy
    if (const Unparking* u = machine.As<Unparking>()) committed += u->copy.weight_bytes;
  }
  return committed;
}

void Core::Wait(uint32_t model) {
  if (std::find(pending_admission_.begin(), pending_admission_.end(), model) ==
      pending_admission_.end()) {
    pending_admission_.push_back(model);
  }
}

void Core::FailWaiters(uint32_t model, const Status& status) {
  std::deque<Waiter> waiters;
  waiters.swap(models_[model].waiters);
  queued_ -= static_cast<uint32_t>(waiters.size());
  for (Waiter& w : waiters) AnswerError(w.call, status);
}

void Core::TryAdmit(uint32_t model) {
  Model& m = models_[model];
  if (m.waiters.empty() || drain_ended_ || m.changing()) return;
  if (Ready* ready = m.machine.As<Ready>()) {
    // Every replica is on the weights' device.
    const uint32_t device = ready->weights.device;
    std::vector<policy::WorkerView> views = WorkerViewsOn(device);
    std::vector<uint32_t> holding;  // every replica, leaving ones too: one per worker
    bool serving = false, attaching = false, attach_blocked = true;
    for (const Replica& r : ready->replicas) {
      holding.push_back(r.worker);
      serving = serving || r.serving();
      if (r.attach_job != 0 && r.leave_job == 0) {
        attaching = true;
        attach_blocked = attach_blocked && views[r.worker].outstanding > 1;
      }
    }
    if (serving) return DrainReady(model);
    if (ready->replicas.empty() && !DeviceUsable(device)) {
      // Held weights that no worker will ever map again (the device's workers exited with status
      // 2, or its memory owner cannot run): let them go; the model loads where it can be served.
      Log(LogLevel::kWarn, "\"{}\" is on device {}, which can no longer serve it: loading it elsewhere",
          m.entry.name, device);
      return Release(model, shm::ReleaseReason::kFailure, /*allow_park=*/false,
                     fmt::format("device {} can no longer serve it", device));
    }
    // A detached model keeps one workspace reserved (model.h): its first attach needs no room.
    // Any other replica does: its workspace must fit (a leaving one still holds its own).
    bool room = ready->replicas.empty() || Fits(device, ready->weights.workspace_bytes);
    uint32_t worker = policy::kNone;
    if (attaching) {
      // Nobody serves it yet. When every attach sits behind other work in its worker's channel
      // (sent to the only worker up, which runs a long request, say), a worker with nothing to
      // do attaches it too; the first to finish serves, the surplus leaves (AdjustReplicas). An
      // attach that runs but hangs is the stall check's (SweepStalls).
      if (attach_blocked) worker = policy::PickIdleWorker(views, holding);
    } else {
      // Detached, or only leaving replicas left (the serving one died during a move or a
      // shrink): resident weights that nobody will serve. Another worker attaches them, no file
      // read.
      worker = policy::PickWorkerForLoad(views, holding);
    }
    // Otherwise looked at again when a job ends (a leaving replica's among them) or a worker
    // comes up.
    if (worker == policy::kNone || !room) return Wait(model);
    return AttachReplica(model, worker);
  }
  // A path refused at registration (outside the model roots, not a regular file) never reaches a
  // worker: only a reload can fix it. Weights already held (adopted across a restart after their
  // file was deleted) and a parked copy need no file.
  if (!m.refused.ok() && !m.machine.Is<Parked>()) return FailWaiters(model, m.refused);
  if (Failed* failed = m.machine.As<Failed>()) {
    if (MonoMs() < failed->until_ms) return FailWaiters(model, FailedStatus(model));
    // Cooldown over: look at the file again, it may have been fixed (or replaced). Looking is I/O:
    // the shell does it and answers with event::ModelInspected, which recovers it to Absent.
    if (!failed->inspecting) {
      failed->inspecting = true;
      actions_.push_back(action::InspectModel{model, m.entry.name, m.entry.engine, m.entry.path});
    }
    return;
  }
  bool parked = m.machine.Is<Parked>();
  if (!parked && !m.machine.Is<Absent>()) return;  // on its way
  uint64_t bytes = parked ? m.machine.As<Parked>()->copy.weight_bytes +
                                m.machine.As<Parked>()->copy.workspace_bytes
                          : m.entry.weight_bytes + m.entry.workspace_bytes;
  policy::PlacementPlan placed =
      policy::PlanPlacement(Residents(), model, m.entry.name, bytes, DeviceRooms(), Limits());
  const policy::AdmissionPlan& plan = placed.plan;
  switch (plan.kind) {
    case policy::AdmissionPlan::Kind::kAdmit: {
      if (devices_down_[placed.device]) return Wait(model);  // until its memory owner is back
      uint32_t worker = policy::PickWorkerForLoad(WorkerViewsOn(placed.device));
      if (worker != policy::kNone) {
        return parked ? StartUnpark(model, worker, bytes) : StartLoad(model, worker, bytes);
      }
      return Wait(model);  // its workers are (re)starting (a usable device has one): their hello retries
    }
    case policy::AdmissionPlan::Kind::kEvict: {
      bool freed_now = false;
      const shm::ReleaseReason why = !plan.by_count          ? shm::ReleaseReason::kBudget
                                     : config_.single_active ? shm::ReleaseReason::kSingleActive
                                                             : shm::ReleaseReason::kCapacity;
      for (uint32_t victim : plan.victims) {
        m.evicted_for.push_back(models_[victim].entry.name);
        Release(victim, why, /*allow_park=*/true,
                fmt::format("evicted to make room for \"{}\"{}", m.entry.name,
                            DeviceCount() > 1 ? fmt::format(" on device {}", placed.device) : ""));
        freed_now = freed_now || !models_[victim].machine.Is<Releasing>();
      }
      // Detached victims go at once (no worker to ask): plan again with the room made.
      if (freed_now) return TryAdmit(model);
      return Wait(model);
    }
    case policy::AdmissionPlan::Kind::kWait:
      if (placed.device == policy::kNoDevice) {
        // No device can ever serve it: every one lost for good or with only fatal workers.
        return FailWaiters(model, Error(Code::kUnavailable,
                                        "no device can serve models: their workers exited with status 2 "
                                        "(fatal configuration) or their memory owner cannot run; see the "
                                        "daemon log"));
      }
      return Wait(model);
    case policy::AdmissionPlan::Kind::kReject:
      return FailWaiters(model, plan.reason);
  }
}

void Core::RetryPending() {
  // Admission may release models whose completion calls back here; one pass at a time. During
  // the drain too: accepted requests waiting for room still get it. Not once it has ended.
  if (retrying_ || drain_ended_) return;
  retrying_ = true;
  std::deque<uint32_t> pending;
  pending.swap(pending_admission_);
  for (uint32_t model : pending) TryAdmit(model);
  retrying_ = false;
  for (uint32_t model : index_->LruOrder()) AdjustReplicas(model);
}

void Core::StartLoad(uint32_t model, uint32_t worker, uint64_t bytes) {
  Model& m = models_[model];
  Job job{.kind = Job::Kind::kLoad, .worker = worker, .model = model};
  v1::WorkerEnvelope message;
  v1::WorkerLoad* load = message.mutable_load();
  load->set_model(model);
  load->set_name(m.entry.name);
  load->set_engine(m.entry.engine);
  load->set_path(m.entry.path);
  load->set_admitted_bytes(bytes);
  load->set_sequences(m.entry.sequences);  // what admission counted (Core::ApplySettings)
  load->set_kv_tokens(m.entry.kv_tokens);
  load->set_prefill_stretch(m.entry.prefill_stretch);
  for (const v1::Fault& f : GrantFaults(job)) *load->add_faults() = f;
  uint64_t id = NewJob(std::move(job));
  load->set_job(id);
  m.machine.StartLoad(DeviceOf(worker), worker, id, bytes, m.entry.weight_bytes);
  Log(LogLevel::kInfo, "loading \"{}\" ({}) on worker {}{}", m.entry.name, FormatBytes(bytes), worker,
      DeviceCount() > 1 ? fmt::format(" (device {})", DeviceOf(worker)) : "");
  SendAllocating(worker, message, id, m.entry.weight_bytes);
  std::get<action::SendToWorker>(actions_.back()).model_file = m.entry.path;
}

void Core::StartUnpark(uint32_t model, uint32_t worker, uint64_t bytes) {
  Model& m = models_[model];
  const Weights& copy = m.machine.As<Parked>()->copy;
  Job job{.kind = Job::Kind::kUnpark, .worker = worker, .model = model};
  v1::WorkerEnvelope message;
  v1::WorkerAttach* attach = message.mutable_attach();
  DescribeAttach(attach, model, m.entry, copy);  // the copy's own description, not the file's
  attach->set_copy(true);
  for (const v1::Fault& f : GrantFaults(job)) *attach->add_faults() = f;
  uint64_t id = NewJob(std::move(job));
  attach->set_job(id);
  // Read before the transition: it moves the copy out of the Parked state that `copy` refers to.
  const int handle = copy.handle;
  const uint64_t allocates = copy.weight_bytes;
  // The KV cache parked with it goes to the engine that unparks it (which sends it back as its own
  // with the reply): the core's descriptor goes once the frame is sent (the channel sends a copy).
  const KeptKvCache cache = m.machine.As<Parked>()->kv_cache;
  std::vector<int> handles;
  if (handle >= 0) handles.push_back(handle);
  // Once a daemon taking over has it (event::HandingOver), the cache is the new one's to write: an
  // engine here writing it too would corrupt what the next unpark there adopts. The weights' copy
  // is only read, and goes on.
  if (handle >= 0 && cache.handle >= 0 && !handing_over_) {
    attach->set_kv_cache(true);
    handles.push_back(cache.handle);
  }
  m.machine.StartUnpark(DeviceOf(worker), worker, id, bytes);
  Log(LogLevel::kInfo, "unparking \"{}\" on worker {}{}", m.entry.name, worker,
      DeviceCount() > 1 ? fmt::format(" (device {})", DeviceOf(worker)) : "");
  SendAllocating(worker, message, id, allocates, std::move(handles));
  Close(cache.handle);
}

// The reason as the metrics name it (warmpool_model_releases_total{reason}).
static const char* ReasonName(shm::ReleaseReason reason) {
  static constexpr const char* kNames[] = {"budget",        "capacity", "keep_alive", "single_active",
                                           "explicit",      "reload",   "failure"};
  const auto i = static_cast<uint32_t>(reason);
  return i < std::size(kNames) ? kNames[i] : "unknown";
}

void Core::Release(uint32_t model, shm::ReleaseReason reason, bool allow_park, std::string_view why) {
  Model& m = models_[model];
  const Ready* ready = m.machine.As<Ready>();
  if (ready == nullptr) return;
  const bool eviction = reason == shm::ReleaseReason::kBudget ||
                        reason == shm::ReleaseReason::kCapacity ||
                        reason == shm::ReleaseReason::kSingleActive;
  if (eviction) index_->Update(model, [](shm::ModelRecord& r) { r.evictions++; });
  shm::StatAdd(segment_.model_stats(model).releases[static_cast<uint32_t>(reason)]);
  bool attached = m.machine.Serving();
  bool park = allow_park && policy::ShouldPark(ready->weights.weight_bytes,
                                               ready->weights.handle >= 0 && attached,
                                               ParkCommitted(), Limits());
  // Every release is logged here, whoever decided it, with the reason the metrics count it under:
  // an operator reading the log sees every model that left a device and why.
  Log(reason == shm::ReleaseReason::kFailure ? LogLevel::kWarn : LogLevel::kInfo,
      "releasing \"{}\" ({}{}{}): {}{}", m.entry.name, ReasonName(reason), why.empty() ? "" : ": ", why,
      park ? "parking it" : "dropping its weights",
      m.inflight != 0 ? fmt::format(" once its {} request(s) end", m.inflight) : "");
  m.machine.StartRelease(park);
  m.expires_at_ms = 0;
  if (m.inflight == 0) SendRelease(model);  // else the last request's end sends it
}

void Core::SendRelease(uint32_t model) {
  Model& m = models_[model];
  Releasing* r = m.machine.As<Releasing>();
  if (r == nullptr || !r->draining) return;
  r->draining = false;
  if (r->park) {
    // A serving replica copies the weights to host memory before it lets go of them: its channel
    // carries the park ahead of its unload. (One attaching or already leaving may not have them.)
    r->park = false;
    for (const Replica& replica : r->replicas) {
      if (!replica.serving()) continue;
      Job job{.kind = Job::Kind::kPark, .worker = replica.worker, .model = model};
      v1::WorkerEnvelope message;
      message.mutable_park()->set_model(model);
      for (const v1::Fault& f : GrantFaults(job)) *message.mutable_park()->add_faults() = f;
      uint64_t id = NewJob(std::move(job));
      message.mutable_park()->set_job(id);
      // A GPU's KV pool is copied out with the weights only where the copy would be kept
      // (OnParkDone): within the park budget beside the weights' copy, not for a daemon taking over.
      if (auto cache = replica_caches_.find({model, replica.worker});
          cache != replica_caches_.end() && cache->second.on_device && !handing_over_ &&
          ParkCommitted() + r->weights.weight_bytes + cache->second.bytes <= config_.park_budget_bytes) {
        message.mutable_park()->set_cache_copy(true);
      }
      r->park_job = id;
      SendAllocating(replica.worker, message, id, r->weights.weight_bytes);  // host memory, for the copy
      break;
    }
  }
  // Every replica lets go of its mapping (one attaching lets go after its attach: the channel
  // keeps the order); the weights go when the last one has.
  for (Replica& replica : r->replicas) {
    if (replica.leave_job != 0) continue;  // already leaving (a move)
    replica.leave_job = SendUnload(model, replica.worker);
  }
  if (r->replicas.empty() && r->park_job == 0) FinishRelease(model);
}

void Core::FinishRelease(uint32_t model) {
  Model& m = models_[model];
  const Releasing* r = m.machine.As<Releasing>();
  const uint64_t bytes = r != nullptr ? r->weights.weight_bytes : 0;  // the copy's too
  const int cache = r != nullptr ? r->kv_cache.handle : -1;
  CloseMemory(m.machine.FinishRelease(), bytes);
  if (!m.machine.Is<Parked>()) Close(cache);  // it parks with the copy, or goes
  m.evicted_for.clear();  // made room for it while it was on a device: no load of it to tell now
  if (const Parked* p = m.machine.As<Parked>()) {
    Log(LogLevel::kInfo, "\"{}\" parked ({} in host memory{})", m.entry.name, FormatBytes(p->copy.weight_bytes),
        p->kv_cache.handle >= 0 ? fmt::format(", its KV cache {} more", FormatBytes(p->kv_cache.bytes)) : "");
  }
  AnswerUnloads(model);
  if (!m.waiters.empty()) TryAdmit(model);  // requests came in meanwhile
  RetryPending();
}

void Core::DropParked(uint32_t model, shm::ReleaseReason reason, std::string_view why) {
  Model& m = models_[model];
  uint64_t bytes = 0;
  if (const Parked* p = m.machine.As<Parked>()) {
    bytes = p->copy.weight_bytes;
    Close(p->kv_cache.handle);  // not memory to reuse for weights: the engine's own
    Log(LogLevel::kInfo, "dropping the parked copy of \"{}\" ({}, {}{}{})", m.entry.name, FormatBytes(bytes),
        ReasonName(reason), why.empty() ? "" : ": ", why);
  }
  CloseMemory(m.machine.DropParked(), bytes);
}

void Core::EnforceMaxCached(uint32_t keep) {
  const std::string why = fmt::format("more than [pool] max_cached = {} models cached", config_.max_cached);
  for (uint32_t victim : policy::PlanMaxCached(Residents(), keep, Limits())) {
    if (models_[victim].machine.Is<Parked>()) {
      shm::StatAdd(segment_.model_stats(victim).releases[static_cast<uint32_t>(shm::ReleaseReason::kCapacity)]);
      DropParked(victim, shm::ReleaseReason::kCapacity, why);
    } else {
      // Parked copies count too: dropped, not parked.
      Release(victim, shm::ReleaseReason::kCapacity, /*allow_park=*/false, why);
    }
  }
}

void Core::ExpireIdle(uint64_t as_of) {
  for (uint32_t model : policy::PlanExpiry(Residents(), as_of)) {
    const Model& m = models_[model];
    const int64_t keep = m.keep_alive_override_ms.value_or(m.keep_alive_ms);
    Release(model, shm::ReleaseReason::kKeepAlive, /*allow_park=*/true,
            keep == 0 ? std::string("keep_alive 0: released when its requests end")
                      : fmt::format("idle for its keep_alive of {:g} s", keep / 1000.0));
  }
}

}  // namespace warmpool::supervisor
