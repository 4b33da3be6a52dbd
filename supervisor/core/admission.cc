// Room and placement: admission (policy::PlanAdmission decides, this acts), loads, unparks,
// replicas, releases (park or drop), max_cached, keep_alive, and moves that spread models over
// the workers. Every change of a model's residency goes through its machine (model.h).
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
    p.device_bytes = r.weight_bytes + r.workspace_bytes;
    p.pinned = m.pinned;
    p.busy = m.inflight != 0 || !m.waiters.empty() || !m.unload_waiters.empty();
    p.expires_at_ms = m.expires_at_ms;
    if (m.machine.Is<Parked>()) {
      p.where = Where::kParked;
      p.device_bytes = 0;
      p.parked_bytes = r.weight_bytes;
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

std::vector<policy::WorkerView> Core::WorkerViews() const {
  std::vector<policy::WorkerView> views(workers_.size());
  for (uint32_t slot = 0; slot < workers_.size(); slot++) {
    const WorkerSlot& w = workers_[slot];
    views[slot] = policy::WorkerView{slot, w.state == WorkerSlot::State::kUp, 0, w.outstanding,
                                     w.pending_bytes};
  }
  for (uint32_t model : index_->LruOrder()) {
    const ModelMachine& machine = models_[model].machine;
    if (const Loading* l = machine.As<Loading>()) views[l->worker].models++;
    if (const Unparking* u = machine.As<Unparking>()) views[u->worker].models++;
    if (const std::vector<Replica>* replicas = machine.Replicas()) {
      for (const Replica& r : *replicas) views[r.worker].models++;
    }
  }
  return views;
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
  if (m.waiters.empty() || drain_ended_) return;
  // A path refused at registration (outside the model roots, not a regular file) never reaches a
  // worker: only a reload can fix it.
  if (!m.refused.ok()) return FailWaiters(model, m.refused);
  if (Ready* ready = m.machine.As<Ready>()) {
    if (!ready->replicas.empty()) return DrainReady(model);  // serving, or attaching: wait for it
    // Detached: resident weights, no worker serving them. A worker attaches them, no file read.
    uint32_t worker = policy::PickWorkerForLoad(WorkerViews());
    if (worker == policy::kNone) return Wait(model);
    return AttachReplica(model, worker);
  }
  if (Failed* failed = m.machine.As<Failed>()) {
    if (MonoMs() < failed->until_ms) return FailWaiters(model, FailedStatus(model));
    if (!m.inspected) {
      // Cooldown over: look at the file again, it may have been fixed (or replaced). Looking is
      // I/O: the shell does it and answers with event::ModelInspected.
      if (!failed->inspecting) {
        failed->inspecting = true;
        actions_.push_back(action::InspectModel{model, m.entry.name, m.entry.engine, m.entry.path});
      }
      return;
    }
  }
  bool parked = m.machine.Is<Parked>();
  if (!parked && !m.machine.Is<Absent>() && !m.machine.Is<Failed>()) return;  // on its way
  uint64_t bytes = parked ? m.machine.As<Parked>()->copy.weight_bytes +
                                m.machine.As<Parked>()->copy.workspace_bytes
                          : m.entry.weight_bytes + m.entry.workspace_bytes;
  policy::AdmissionPlan plan = policy::PlanAdmission(Residents(), model, m.entry.name, bytes,
                                                     index_->DeviceUsed(0), Limits());
  switch (plan.kind) {
    case policy::AdmissionPlan::Kind::kAdmit: {
      uint32_t worker = policy::PickWorkerForLoad(WorkerViews());
      if (worker != policy::kNone) {
        return parked ? StartUnpark(model, worker, bytes) : StartLoad(model, worker, bytes);
      }
      if (!AnyCanServe()) {
        return FailWaiters(model, Error(Code::kUnavailable,
                                        "no worker is running (they exited with status 2, fatal "
                                        "configuration): see the daemon log"));
      }
      return Wait(model);  // workers are (re)starting: their hello retries
    }
    case policy::AdmissionPlan::Kind::kEvict: {
      bool freed_now = false;
      for (uint32_t victim : plan.victims) {
        Log(LogLevel::kInfo, "evicting \"{}\" to make room for \"{}\"", models_[victim].entry.name,
            m.entry.name);
        Release(victim, /*eviction=*/true, /*allow_park=*/true);
        freed_now = freed_now || !models_[victim].machine.Is<Releasing>();
      }
      // Detached victims go at once (no worker to ask): plan again with the room made.
      if (freed_now) return TryAdmit(model);
      return Wait(model);
    }
    case policy::AdmissionPlan::Kind::kWait:
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
  m.inspected = false;
  Job job;
  job.kind = Job::Kind::kLoad;
  job.worker = worker;
  job.model = model;
  v1::WorkerEnvelope message;
  v1::WorkerLoad* load = message.mutable_load();
  load->set_model(model);
  load->set_name(m.entry.name);
  load->set_engine(m.entry.engine);
  load->set_path(m.entry.path);
  load->set_admitted_bytes(bytes);
  for (const v1::Fault& f : GrantFaults(job)) *load->add_faults() = f;
  uint64_t id = NewJob(std::move(job));
  load->set_job(id);
  m.machine.StartLoad(worker, id, bytes, m.entry.weight_bytes);
  Log(LogLevel::kInfo, "loading \"{}\" ({}) on worker {}", m.entry.name, FormatBytes(bytes), worker);
  Send(worker, message);
}

namespace {

void DescribeAttach(v1::WorkerAttach* attach, uint32_t model, const ModelEntry& entry,
                    const Weights& w) {
  attach->set_model(model);
  attach->set_name(entry.name);
  attach->set_engine(entry.engine);
  attach->set_path(entry.path);
  attach->set_header(w.header);
  attach->set_file_size(w.file_size);
  attach->set_weight_bytes(w.handle >= 0 ? w.weight_bytes : 0);
}

}  // namespace

void Core::StartUnpark(uint32_t model, uint32_t worker, uint64_t bytes) {
  Model& m = models_[model];
  const Weights& copy = m.machine.As<Parked>()->copy;
  Job job;
  job.kind = Job::Kind::kUnpark;
  job.worker = worker;
  job.model = model;
  v1::WorkerEnvelope message;
  v1::WorkerAttach* attach = message.mutable_attach();
  DescribeAttach(attach, model, m.entry, copy);  // the copy's own description, not the file's
  attach->set_copy(true);
  for (const v1::Fault& f : GrantFaults(job)) *attach->add_faults() = f;
  uint64_t id = NewJob(std::move(job));
  attach->set_job(id);
  int handle = copy.handle;
  m.machine.StartUnpark(worker, id, bytes);
  Log(LogLevel::kInfo, "unparking \"{}\" on worker {}", m.entry.name, worker);
  Send(worker, message, handle >= 0 ? std::vector<int>{handle} : std::vector<int>{});
}

void Core::AttachReplica(uint32_t model, uint32_t worker, uint32_t moving_from) {
  Model& m = models_[model];
  const Weights& weights = m.machine.As<Ready>()->weights;
  Job job;
  job.kind = Job::Kind::kAttach;
  job.worker = worker;
  job.model = model;
  job.moving_from = moving_from;
  v1::WorkerEnvelope message;
  v1::WorkerAttach* attach = message.mutable_attach();
  DescribeAttach(attach, model, m.entry, weights);
  for (const v1::Fault& f : GrantFaults(job)) *attach->add_faults() = f;
  uint64_t id = NewJob(std::move(job));
  attach->set_job(id);
  int handle = weights.handle;
  m.machine.AddReplica(worker, id);
  Log(LogLevel::kInfo, "attaching the resident weights of \"{}\" to worker {}", m.entry.name, worker);
  Send(worker, message, handle >= 0 ? std::vector<int>{handle} : std::vector<int>{});
}

void Core::Release(uint32_t model, bool eviction, bool allow_park) {
  Model& m = models_[model];
  const Ready* ready = m.machine.As<Ready>();
  if (ready == nullptr) return;
  if (eviction) index_->Update(model, [](shm::ModelRecord& r) { r.evictions++; });
  bool attached = std::any_of(ready->replicas.begin(), ready->replicas.end(),
                              [](const Replica& r) { return r.serving(); });
  bool park = allow_park && policy::ShouldPark(ready->weights.weight_bytes,
                                               ready->weights.handle >= 0 && attached,
                                               ParkCommitted(), Limits());
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
      Job job;
      job.kind = Job::Kind::kPark;
      job.worker = replica.worker;
      job.model = model;
      v1::WorkerEnvelope message;
      message.mutable_park()->set_model(model);
      for (const v1::Fault& f : GrantFaults(job)) *message.mutable_park()->add_faults() = f;
      uint64_t id = NewJob(std::move(job));
      message.mutable_park()->set_job(id);
      r->park_job = id;
      Send(replica.worker, message);
      break;
    }
  }
  // Every replica lets go of its mapping (one attaching lets go after its attach: the channel
  // keeps the order); the weights go when the last one has.
  for (Replica& replica : r->replicas) {
    if (replica.leave_job != 0) continue;  // already leaving (a move)
    Job job;
    job.kind = Job::Kind::kUnload;
    job.worker = replica.worker;
    job.model = model;
    v1::WorkerEnvelope message;
    message.mutable_unload()->set_model(model);
    for (const v1::Fault& f : GrantFaults(job)) *message.mutable_unload()->add_faults() = f;
    uint64_t id = NewJob(std::move(job));
    message.mutable_unload()->set_job(id);
    replica.leave_job = id;
    Send(replica.worker, message);
  }
  if (r->replicas.empty() && r->park_job == 0) FinishRelease(model);
}

void Core::FinishRelease(uint32_t model) {
  Model& m = models_[model];
  Close(m.machine.FinishRelease());
  if (const Parked* p = m.machine.As<Parked>()) {
    Log(LogLevel::kInfo, "\"{}\" parked ({} in host memory)", m.entry.name,
        FormatBytes(p->copy.weight_bytes));
  }
  AnswerUnloads(model);
  if (!m.waiters.empty()) TryAdmit(model);  // requests came in meanwhile
  RetryPending();
}

void Core::DropParked(uint32_t model) {
  Close(models_[model].machine.DropParked());
}

void Core::SendLeave(uint32_t model, uint32_t worker) {
  Job job;
  job.kind = Job::Kind::kUnload;
  job.worker = worker;
  job.model = model;
  v1::WorkerEnvelope message;
  message.mutable_unload()->set_model(model);
  for (const v1::Fault& f : GrantFaults(job)) *message.mutable_unload()->add_faults() = f;
  uint64_t id = NewJob(std::move(job));
  message.mutable_unload()->set_job(id);
  models_[model].machine.ReplicaLeaving(worker, id);
  Send(worker, message);
}

void Core::AdjustReplicas(uint32_t model) {
  Model& m = models_[model];
  const Ready* ready = m.machine.As<Ready>();
  if (ready == nullptr || ready->replicas.empty() || stopping_) return;
  uint32_t target = std::min<uint32_t>(m.target_replicas, static_cast<uint32_t>(workers_.size()));
  size_t staying = std::count_if(ready->replicas.begin(), ready->replicas.end(),
                                 [](const Replica& r) { return r.leave_job == 0; });
  if (staying > target) {
    std::vector<uint32_t> serving = m.machine.ServingWorkers();
    if (serving.size() < 2) return;  // only serving replicas leave, and never the last
    SendLeave(model, policy::PickReplicaToDrop(WorkerViews(), serving));
    return;
  }
  for (;;) {
    // Everything is looked up again each time round: making room may release models, and their
    // release may have grown this one already (RetryPending).
    ready = m.machine.As<Ready>();
    if (ready == nullptr || ready->replicas.empty()) return;
    std::vector<uint32_t> busy;
    for (const Replica& r : ready->replicas) busy.push_back(r.worker);
    size_t staying_now = std::count_if(ready->replicas.begin(), ready->replicas.end(),
                                       [](const Replica& r) { return r.leave_job == 0; });
    if (staying_now >= target) return;
    uint32_t worker = policy::PickWorkerForLoad(WorkerViews(), busy);
    if (worker == policy::kNone) return;  // fewer workers up than replicas: a hello grows it
    uint64_t workspace = ready->weights.workspace_bytes;
    uint64_t budget = config_.budget_bytes;
    if (budget != 0 && index_->DeviceUsed(0) + workspace > budget) {
      // Room for the replica's workspace comes like room for a load: idle models, LRU first.
      policy::Limits bytes_only{budget, 0, 0, 0};
      policy::AdmissionPlan plan = policy::PlanAdmission(Residents(), model, m.entry.name,
                                                         workspace, index_->DeviceUsed(0), bytes_only);
      if (plan.kind != policy::AdmissionPlan::Kind::kEvict) return;  // RetryPending grows it later
      for (uint32_t victim : plan.victims) Release(victim, /*eviction=*/true, /*allow_park=*/true);
      if (index_->DeviceUsed(0) + workspace > budget) return;
      continue;
    }
    AttachReplica(model, worker);
  }
}

void Core::EnforceMaxCached(uint32_t keep) {
  for (uint32_t victim : policy::PlanMaxCached(Residents(), keep, Limits())) {
    if (models_[victim].machine.Is<Parked>()) DropParked(victim);
    else Release(victim, /*eviction=*/true, /*allow_park=*/false);  // parked copies count too: drop
  }
}

void Core::ExpireIdle() {
  for (uint32_t model : policy::PlanExpiry(Residents(), MonoMs())) {
    Log(LogLevel::kInfo, "\"{}\" idle past its keep_alive; releasing it", models_[model].entry.name);
    Release(model, /*eviction=*/false, /*allow_park=*/true);
  }
}

void Core::Rebalance() {
  if (stopping_) return;
  std::vector<policy::WorkerView> views = WorkerViews();
  std::vector<policy::PlacedModel> placed;
  for (uint32_t model : index_->LruOrder()) {
    const Model& m = models_[model];
    const Ready* ready = m.machine.As<Ready>();
    if (ready == nullptr) continue;
    policy::PlacedModel p;
    p.model = model;
    p.workers = m.machine.ServingWorkers();
    p.movable = p.workers.size() == ready->replicas.size() && m.target_replicas <= 1;
    p.waiting = static_cast<uint32_t>(m.waiters.size());
    placed.push_back(std::move(p));
  }
  std::optional<policy::Move> move = policy::PlanRebalance(views, placed);
  if (!move) return;
  const Model& m = models_[move->model];
  uint64_t workspace = m.machine.As<Ready>()->weights.workspace_bytes;
  if (config_.budget_bytes != 0 && index_->DeviceUsed(0) + workspace > config_.budget_bytes) return;
  Log(LogLevel::kInfo, "moving \"{}\" from worker {}, which holds several models, to idle worker {}",
      m.entry.name, move->from, move->to);
  AttachReplica(move->model, move->to, move->from);
}

}  // namespace warmpool::supervisor
