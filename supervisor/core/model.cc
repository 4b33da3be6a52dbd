#include "supervisor/core/model.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <utility>

namespace warmpool::supervisor {

using namespace residency;

void CheckFailed(const char* file, int line, const char* what) {
  std::fprintf(stderr, "warmpoold: internal error at %s:%d: %s\n", file, line, what);
  std::abort();
}

std::string_view ResidencyName(const Residency& state) {
  static constexpr std::string_view kNames[] = {"absent", "failed", "loading", "unparking",
                                                "ready", "releasing", "parked"};
  return kNames[state.index()];
}

const Weights* ModelMachine::DeviceWeights() const {
  if (const Ready* r = As<Ready>()) return &r->weights;
  if (const Releasing* r = As<Releasing>()) return &r->weights;
  return nullptr;
}

const std::vector<Replica>* ModelMachine::Replicas() const {
  if (const Ready* r = As<Ready>()) return &r->replicas;
  if (const Releasing* r = As<Releasing>()) return &r->replicas;
  return nullptr;
}

std::vector<Replica>* ModelMachine::MutableReplicas() {
  return const_cast<std::vector<Replica>*>(std::as_const(*this).Replicas());
}

uint32_t ModelMachine::Device() const {
  if (const Loading* l = As<Loading>()) return l->device;
  if (const Unparking* u = As<Unparking>()) return u->device;
  if (const Weights* w = DeviceWeights()) return w->device;
  return shm::kNil;
}

std::vector<uint32_t> ModelMachine::ServingWorkers() const {
  std::vector<uint32_t> workers;
  if (const Ready* r = As<Ready>()) {
    for (const Replica& replica : r->replicas) {
      if (replica.serving()) workers.push_back(replica.worker);
    }
  }
  return workers;
}

bool ModelMachine::Serving() const {
  const Ready* r = As<Ready>();
  return r != nullptr && std::any_of(r->replicas.begin(), r->replicas.end(),
                                     [](const Replica& replica) { return replica.serving(); });
}

bool ModelMachine::HasWorker(uint32_t worker) const {
  bool found = false;
  ForEachWorker([&](uint32_t w) { found = found || w == worker; });
  return found;
}

std::vector<int> ModelMachine::Handles() const {
  std::vector<int> handles;
  auto add = [&](int h) {
    if (h >= 0) handles.push_back(h);
  };
  if (const Weights* w = DeviceWeights()) add(w->handle);
  if (const Unparking* u = As<Unparking>()) add(u->copy.handle);
  if (const Releasing* r = As<Releasing>()) {
    if (r->copy) add(r->copy->handle);
    add(r->kv_cache.handle);
  }
  if (const Parked* p = As<Parked>()) {
    add(p->copy.handle);
    add(p->kv_cache.handle);
  }
  return handles;
}

void ModelMachine::SetRegisteredBytes(uint64_t bytes) {
  registered_bytes_ = bytes;
  Publish();
}

void ModelMachine::To(Residency next) {
  state_ = std::move(next);
  Publish();
}

void ModelMachine::Publish() {
  shm::ModelIndex::Residency r;
  std::string error;
  std::visit(
      [&](const auto& s) {
        using S = std::decay_t<decltype(s)>;
        if constexpr (std::is_same_v<S, Absent>) {
          r.state = shm::ModelState::kRegistered;
          r.weight_bytes = registered_bytes_;
        } else if constexpr (std::is_same_v<S, Failed>) {
          r.state = shm::ModelState::kFailed;
          r.weight_bytes = registered_bytes_;
          error = s.reason;
        } else if constexpr (std::is_same_v<S, Loading>) {
          r.state = shm::ModelState::kLoading;
          r.device = s.device;
          r.worker_slot = s.worker;
          r.replicas = 1;
          r.weight_bytes = std::min(registered_bytes_, s.admitted_bytes);
          r.workspace_bytes = s.admitted_bytes - r.weight_bytes;
        } else if constexpr (std::is_same_v<S, Unparking>) {
          r.state = shm::ModelState::kLoading;
          r.device = s.device;
          r.worker_slot = s.worker;
          r.replicas = 1;
          r.weight_bytes = std::min(s.copy.weight_bytes, s.admitted_bytes);
          r.workspace_bytes = s.admitted_bytes - r.weight_bytes;
        } else if constexpr (std::is_same_v<S, Ready> || std::is_same_v<S, Releasing>) {
          r.state = std::is_same_v<S, Ready> ? shm::ModelState::kReady : shm::ModelState::kUnloading;
          r.device = s.weights.device;
          r.weight_bytes = s.weights.weight_bytes;
          // One workspace stays reserved for a detached model: re-attaching needs no admission.
          r.workspace_bytes = s.weights.workspace_bytes * std::max<size_t>(1, s.replicas.size());
          r.replicas = static_cast<uint32_t>(s.replicas.size());
          for (const Replica& replica : s.replicas) {
            if (replica.serving()) {
              r.worker_slot = replica.worker;
              break;
            }
          }
          if (r.worker_slot == shm::kNil && !s.replicas.empty()) r.worker_slot = s.replicas.front().worker;
        } else if constexpr (std::is_same_v<S, Parked>) {
          r.state = shm::ModelState::kParked;
          r.weight_bytes = s.copy.weight_bytes;
          r.workspace_bytes = s.kv_cache.bytes;
        }
      },
      state_);
  r.error = error;
  index_->Publish(model_, r);
}

void ModelMachine::StartLoad(uint32_t device, uint32_t worker, uint64_t job,
                             uint64_t admitted_bytes, uint64_t weight_bytes) {
  WARMPOOL_CHECK(Is<Absent>() || Is<Failed>());
  registered_bytes_ = weight_bytes;
  To(Loading{device, worker, job, admitted_bytes});
}

void ModelMachine::StartUnpark(uint32_t device, uint32_t worker, uint64_t job,
                               uint64_t admitted_bytes) {
  Parked* p = As<Parked>();
  WARMPOOL_CHECK(p != nullptr);
  Weights copy = std::move(p->copy);
  To(Unparking{device, worker, job, admitted_bytes, std::move(copy)});
}

void ModelMachine::FinishLoad(Weights weights) {
  Loading* l = As<Loading>();
  WARMPOOL_CHECK(l != nullptr);
  uint32_t worker = l->worker;
  weights.device = l->device;
  To(Ready{std::move(weights), {Replica{worker, 0, 0}}});
}

int ModelMachine::FinishUnpark(Weights weights) {
  Unparking* u = As<Unparking>();
  WARMPOOL_CHECK(u != nullptr);
  int copy = u->copy.handle;
  uint32_t worker = u->worker;
  weights.device = u->device;
  To(Ready{std::move(weights), {Replica{worker, 0, 0}}});
  return copy;
}

void ModelMachine::AbandonLoad() {
  WARMPOOL_CHECK(Is<Loading>());
  To(Absent{});
}

void ModelMachine::AbandonUnpark() {
  Unparking* u = As<Unparking>();
  WARMPOOL_CHECK(u != nullptr);
  Weights copy = std::move(u->copy);
  To(Parked{std::move(copy)});
}

int ModelMachine::FailUnpark() {
  Unparking* u = As<Unparking>();
  WARMPOOL_CHECK(u != nullptr);
  int copy = u->copy.handle;
  To(Absent{});
  return copy;
}

void ModelMachine::AddReplica(uint32_t worker, uint64_t job) {
  Ready* r = As<Ready>();
  WARMPOOL_CHECK(r != nullptr && !HasWorker(worker));
  r->replicas.push_back(Replica{worker, job, 0});
  Publish();
}

void ModelMachine::ReplicaAttached(uint32_t worker) {
  std::vector<Replica>* replicas = MutableReplicas();
  WARMPOOL_CHECK(replicas != nullptr);
  for (Replica& r : *replicas) {
    if (r.worker == worker) r.attach_job = 0;
  }
  Publish();
}

void ModelMachine::ReplicaLeaving(uint32_t worker, uint64_t job) {
  Ready* ready = As<Ready>();
  WARMPOOL_CHECK(ready != nullptr);
  for (Replica& r : ready->replicas) {
    if (r.worker == worker) r.leave_job = job;
  }
  Publish();
}

void ModelMachine::DropReplica(uint32_t worker) {
  std::vector<Replica>* replicas = MutableReplicas();
  WARMPOOL_CHECK(replicas != nullptr);
  std::erase_if(*replicas, [&](const Replica& r) { return r.worker == worker; });
  Publish();
}

void ModelMachine::StartRelease(bool park) {
  Ready* r = As<Ready>();
  WARMPOOL_CHECK(r != nullptr);
  Releasing next;
  next.weights = std::move(r->weights);
  next.replicas = std::move(r->replicas);
  next.park = park;
  To(std::move(next));
}

std::vector<int> ModelMachine::FinishRelease() {
  Releasing* r = As<Releasing>();
  WARMPOOL_CHECK(r != nullptr && r->replicas.empty() && r->park_job == 0);
  std::vector<int> close;
  if (r->weights.handle >= 0) close.push_back(r->weights.handle);
  if (r->then_failed) {
    if (r->copy && r->copy->handle >= 0) close.push_back(r->copy->handle);
    Failed failed = std::move(*r->then_failed);
    To(std::move(failed));
  } else if (r->copy) {
    Weights copy = std::move(*r->copy);
    const KeptKvCache cache = r->kv_cache;
    To(Parked{std::move(copy), cache});
  } else {
    To(Absent{});
  }
  return close;
}

void ModelMachine::KeepKvCache(KeptKvCache cache) {
  Parked* p = As<Parked>();
  WARMPOOL_CHECK(p != nullptr && p->kv_cache.handle < 0);
  p->kv_cache = cache;
  Publish();
}

int ModelMachine::DropParked() {
  Parked* p = As<Parked>();
  WARMPOOL_CHECK(p != nullptr);
  int handle = p->copy.handle;
  To(Absent{});
  return handle;
}

void ModelMachine::Fail(uint64_t until_ms, std::string reason) {
  if (Releasing* r = As<Releasing>()) {
    r->then_failed = Failed{until_ms, std::move(reason), false};
    return;
  }
  WARMPOOL_CHECK(Is<Absent>() || Is<Failed>());
  To(Failed{until_ms, std::move(reason), false});
}

void ModelMachine::Adopt(Weights weights, bool parked) {
  WARMPOOL_CHECK(Is<Absent>() || Is<Failed>());
  if (parked) return To(Parked{std::move(weights)});
  To(Ready{std::move(weights), {}});
}

void ModelMachine::Recover() {
  WARMPOOL_CHECK(Is<Failed>());
  To(Absent{});
}

}  // namespace warmpool::supervisor
