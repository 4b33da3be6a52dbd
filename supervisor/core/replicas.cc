// Replicas and placement: a model's replicas attach (the held weights, no file read), leave, and
// grow or shrink to the model's target; policy::PlanRebalance moves a model from a worker holding
// several to one holding none. What each worker holds is derived from the machines (WorkerViews).
#include <algorithm>

#include "common/units.h"
#include "supervisor/core/core.h"

namespace warmpool::supervisor {

using namespace residency;

void Core::DescribeAttach(v1::WorkerAttach* attach, uint32_t model, const ModelEntry& entry,
                    const Weights& w) {
  attach->set_model(model);
  attach->set_name(entry.name);
  attach->set_engine(entry.engine);
  attach->set_path(entry.path);
  ToWire(w, attach->mutable_weights());
  if (w.handle < 0) attach->mutable_weights()->set_weight_bytes(0);  // no region comes with it
}

std::vector<policy::WorkerView> Core::WorkerLoads() const {
  std::vector<policy::WorkerView> views(workers_.size());
  for (uint32_t slot = 0; slot < workers_.size(); slot++) {
    const WorkerSlot& w = workers_[slot];
    // A worker being killed finishes nothing more: it takes no new work.
    views[slot] = policy::WorkerView{slot, w.state == WorkerSlot::State::kUp && !w.killing, 0, w.outstanding,
                                     w.pending_bytes};
  }
  return views;
}

std::vector<policy::WorkerView> Core::WorkerViews() const {
  std::vector<policy::WorkerView> views = WorkerLoads();
  for (uint32_t model : index_->LruOrder()) {
    models_[model].machine.ForEachWorker([&](uint32_t worker) { views[worker].models++; });
  }
  return views;
}

std::vector<policy::WorkerView> Core::WorkerViewsOn(uint32_t device) const {
  std::vector<policy::WorkerView> views = WorkerViews();
  for (policy::WorkerView& v : views) v.up = v.up && DeviceOf(v.slot) == device;
  return views;
}

std::vector<policy::DeviceRoom> Core::DeviceRooms() const {
  std::vector<policy::DeviceRoom> rooms;
  for (uint32_t d = 0; d < DeviceCount(); d++) {
    policy::DeviceRoom room{d, index_->DeviceUsed(d), Budget(d), DeviceUsable(d), false, false};
    for (uint32_t slot = d * config_.workers_per_device; slot < (d + 1) * config_.workers_per_device; slot++) {
      const WorkerSlot& w = workers_[slot];
      room.up = room.up || (w.state == WorkerSlot::State::kUp && !w.killing);
      room.coming = room.coming || w.state == WorkerSlot::State::kStarting;
    }
    // Its memory owner is restarting: nothing goes there until it is back (DeviceRestored).
    if (devices_down_[d]) room.up = room.coming = false;
    rooms.push_back(room);
  }
  return rooms;
}

void Core::AttachReplica(uint32_t model, uint32_t worker, uint32_t moving_from) {
  Model& m = models_[model];
  const Weights& weights = m.machine.As<Ready>()->weights;
  WARMPOOL_CHECK(DeviceOf(worker) == weights.device);
  Job job{.kind = Job::Kind::kAttach, .worker = worker, .model = model};
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

uint64_t Core::SendUnload(uint32_t model, uint32_t worker) {
  Job job{.kind = Job::Kind::kUnload, .worker = worker, .model = model};
  // Behind the model's attach (or load) on the worker's load thread, as the worker queues it.
  job.load_thread = std::any_of(jobs_.begin(), jobs_.end(), [&](const auto& entry) {
    const Job& other = entry.second;
    return other.worker == worker && other.model == model && other.load_thread;
  });
  v1::WorkerEnvelope message;
  message.mutable_unload()->set_model(model);
  for (const v1::Fault& f : GrantFaults(job)) *message.mutable_unload()->add_faults() = f;
  uint64_t id = NewJob(std::move(job));
  message.mutable_unload()->set_job(id);
  Send(worker, message);
  return id;
}

void Core::SendLeave(uint32_t model, uint32_t worker) {
  models_[model].machine.ReplicaLeaving(worker, SendUnload(model, worker));
}

std::string Core::AdjustReplicas(uint32_t model) {
  Model& m = models_[model];
  const Ready* ready = m.machine.As<Ready>();
  if (ready == nullptr || ready->replicas.empty() || stopping_ || m.changing()) return {};
  // Replicas share the weights where they are: at most one per worker of their device.
  const uint32_t device = ready->weights.device;
  uint32_t target = std::min<uint32_t>(m.target_replicas, config_.workers_per_device);
  size_t staying = std::count_if(ready->replicas.begin(), ready->replicas.end(),
                                 [](const Replica& r) { return r.leave_job == 0; });
  if (staying > target) {
    std::vector<uint32_t> serving = m.machine.ServingWorkers();
    if (serving.size() < 2) return {};  // only serving replicas leave, and never the last
    SendLeave(model, policy::PickReplicaToDrop(WorkerViews(), serving));
    return {};
  }
  for (;;) {
    // Everything is looked up again each time round: making room may release models, and their
    // release may have grown this one already (RetryPending).
    ready = m.machine.As<Ready>();
    if (ready == nullptr || ready->replicas.empty()) return {};
    std::vector<uint32_t> busy;
    for (const Replica& r : ready->replicas) busy.push_back(r.worker);
    size_t staying_now = std::count_if(ready->replicas.begin(), ready->replicas.end(),
                                       [](const Replica& r) { return r.leave_job == 0; });
    if (staying_now >= target) return {};
    uint32_t worker = policy::PickWorkerForLoad(WorkerViewsOn(device), busy);
    if (worker == policy::kNone) {
      // A hello grows it later.
      return fmt::format("no other worker of device {} is up to serve it yet (it grows when one is)",
                         device);
    }
    uint64_t workspace = ready->weights.workspace_bytes;
    if (!Fits(device, workspace)) {
      // Room for the replica's workspace comes like room for a load: idle models of its device,
      // LRU first.
      policy::Limits bytes_only{Budget(device), 0, 0, 0};
      policy::AdmissionPlan plan =
          policy::PlanAdmission(policy::OnDevice(Residents(), device), model, m.entry.name,
                                workspace, index_->DeviceUsed(device), bytes_only);
      const std::string no_room =
          fmt::format("no room on device {} for another workspace of {} (budget {}, {} in use)", device,
                      FormatBytes(workspace), FormatBytes(Budget(device)), FormatBytes(index_->DeviceUsed(device)));
      if (plan.kind != policy::AdmissionPlan::Kind::kEvict) return no_room;  // RetryPending grows it later
      for (uint32_t victim : plan.victims) {
        m.evicted_for.push_back(models_[victim].entry.name);
        Release(victim, shm::ReleaseReason::kBudget, /*allow_park=*/true,
                fmt::format("evicted to make room for a replica of \"{}\"", m.entry.name));
      }
      if (!Fits(device, workspace)) return no_room;
      continue;
    }
    AttachReplica(model, worker);
  }
}

void Core::Rebalance() {
  if (stopping_) return;
  // A move attaches the weights where they are: within one device.
  for (uint32_t device = 0; device < DeviceCount(); device++) Rebalance(device);
}

void Core::Rebalance(uint32_t device) {
  std::vector<policy::WorkerView> views = WorkerViewsOn(device);
  std::vector<policy::PlacedModel> placed;
  for (uint32_t model : index_->LruOrder()) {
    const Model& m = models_[model];
    const Ready* ready = m.machine.As<Ready>();
    if (ready == nullptr || ready->weights.device != device) continue;
    policy::PlacedModel p;
    p.model = model;
    p.workers = m.machine.ServingWorkers();
    p.movable = !p.workers.empty() && p.workers.size() == ready->replicas.size() && !m.changing();
    p.waiting = static_cast<uint32_t>(m.waiters.size());
    placed.push_back(std::move(p));
  }
  std::optional<policy::Move> move = policy::PlanRebalance(views, placed);
  if (!move) return;
  const Model& m = models_[move->model];
  uint64_t workspace = m.machine.As<Ready>()->weights.workspace_bytes;
  if (!Fits(device, workspace)) return;
  Log(LogLevel::kInfo, "moving \"{}\" from worker {}, which holds several models, to idle worker {}",
      m.entry.name, move->from, move->to);
  AttachReplica(move->model, move->to, move->from);
}

}  // namespace warmpool::supervisor
