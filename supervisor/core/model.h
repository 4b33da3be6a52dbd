// One model's lifecycle, written down in one place. A model is in exactly one residency state;
// the only way from one to another is a transition below, each of which starts from the state(s)
// it names (anything else is a bug in the core and stops it: CHECK) and publishes the record in
// the segment, which is derived from the state and never kept beside it.
//
//                      load ok                           all replicas let go
//   Absent ──load──▶ Loading ──────▶ Ready ──release──▶ Releasing ───────────┬──▶ Absent | Failed
//     ▲  │            │   ▲ (worker     │ ▲ replicas come   (waits for the    │
//     │  │  failed,   │   │  died: no   │ │ and go (attach, requests in flight)└──▶ Parked
//     │  │  died      ▼   │  weights)   │ │ leave, die)                             │
//     │  └─────── Absent/Failed          ▼ │                                         │
//     │                              detached: Ready                                 │
//     │                              with no replica, weights held                   │
//     │                                                                              ▼
//     └───────────────────────── drop ◀─────────────────────────────────── Parked ──unpark──▶
//                                                                           ▲    Unparking ──ok──▶ Ready
//                                                                           └── died ┘  └─failed─▶ Absent
//
// Failed is Absent with a cooldown and a reason; after the cooldown the file is looked at again.
//
// Weights and their description travel together (Weights): the description of a resident model
// is the file's header as the loading worker read it, never the registration's, so an attach, a
// replica or an unpark always describes exactly the bytes it maps.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "common/file_version.h"
#include "shm/model_index.h"
#include "supervisor/core/model_entry.h"

namespace warmpool::supervisor {

// Stops the process with the place and the message: a transition from the wrong state is a bug.
#define WARMPOOL_CHECK(cond, ...) \
  do {                            \
    if (!(cond)) ::warmpool::supervisor::CheckFailed(__FILE__, __LINE__, #cond); \
  } while (0)
[[noreturn]] void CheckFailed(const char* file, int line, const char* what);

// The description is what the worker that read them said; its version is what a reload and a warm
// restart compare with the file as it is now (zero when nobody said: engines without a file).
struct Weights : WeightsDescription {
  // Where they are: the device the model was loaded or unparked on (a host copy keeps the device
  // it came from, which means nothing for it).
  uint32_t device = 0;
  int handle = -1;  // the region (held while resident); -1 for engines without weights (echo)
};

// A worker serving a resident model from its weights.
struct Replica {
  uint32_t worker = 0;
  uint64_t attach_job = 0;  // non-zero until the worker has attached: takes no requests yet
  uint64_t leave_job = 0;   // non-zero once its unload is on its way: takes no new requests
  bool serving() const { return attach_job == 0 && leave_job == 0; }
};

// A language model's KV cache region that its engine left cleanly when the model was parked (engine
// ABI version 11): kept with the parked copy, counted against the park budget with it, and handed
// to the engine that unparks it, which finds its prefix cache there again.
struct KeptKvCache {
  int handle = -1;
  uint64_t bytes = 0;
  // Device memory (a GPU's pool, held by its grant: WorkerLoadDone.cache_grant): kept for the
  // streams resumed after its worker's death, never to park with (parking frees the device).
  bool on_device = false;
};

namespace residency {
struct Absent {};
struct Failed {
  uint64_t until_ms = 0;
  std::string reason;
  bool inspecting = false;  // after the cooldown: its file is being looked at again
};
struct Loading {  // a worker reads the file
  uint32_t device = 0;  // the worker's
  uint32_t worker = 0;
  uint64_t job = 0;
  uint64_t admitted_bytes = 0;
};
struct Unparking {  // a worker copies the parked host copy into device memory
  uint32_t device = 0;  // the worker's
  uint32_t worker = 0;
  uint64_t job = 0;
  uint64_t admitted_bytes = 0;
  Weights copy;  // copy.handle: the host copy, held until the device has it
};
struct Ready {
  Weights weights;
  std::vector<Replica> replicas;  // empty: detached (its last worker died), weights still held
};
struct Releasing {
  Weights weights;
  std::vector<Replica> replicas;  // each lets go (its unload job); gone when it has
  bool draining = true;           // waiting for the requests in flight before letting go
  bool park = false;              // a host copy is made first (park_job) ...
  uint64_t park_job = 0;
  std::optional<Weights> copy;    // ... and kept here once made, with a replica's KV cache
  KeptKvCache kv_cache;           // (taken when its unload says its engine closed; a GPU's pool's host
                                  // copy, when the park's reply brought one)
  std::optional<Failed> then_failed;  // it failed meanwhile: it ends failed, not registered
};
struct Parked {
  Weights copy;  // copy.handle: the host copy; the rest describes it
  KeptKvCache kv_cache;  // none (-1) unless parking kept one: published as the record's workspace
};
}  // namespace residency

using Residency = std::variant<residency::Absent, residency::Failed, residency::Loading,
                               residency::Unparking, residency::Ready, residency::Releasing,
                               residency::Parked>;

std::string_view ResidencyName(const Residency& state);

// The residency of one model and its record in the segment. Every transition publishes.
class ModelMachine {
 public:
  ModelMachine() = default;
  void Bind(shm::ModelIndex* index, uint32_t model) {
    index_ = index;
    model_ = model;
  }
  const Residency& state() const { return state_; }
  template <typename S>
  S* As() { return std::get_if<S>(&state_); }
  template <typename S>
  const S* As() const { return std::get_if<S>(&state_); }
  template <typename S>
  bool Is() const { return std::holds_alternative<S>(state_); }

  // Weights held on the device (Ready or Releasing), or null.
  const Weights* DeviceWeights() const;
  // The replicas (Ready or Releasing); empty otherwise.
  const std::vector<Replica>* Replicas() const;
  // The device whose budget the model counts against now (loading, unparking, ready, releasing);
  // shm::kNil when it holds no device memory.
  uint32_t Device() const;
  // Replicas that take requests now (Ready only).
  std::vector<uint32_t> ServingWorkers() const;
  bool Serving() const;
  // Calls f(worker) for each worker that holds the model or is taking it (loading, unparking, a
  // replica attaching, serving or leaving): at most once per worker.
  template <typename F>
  void ForEachWorker(F&& f) const;
  bool HasWorker(uint32_t worker) const;
  // Handles this model holds: weights on the device, a host copy, or both while unparking.
  std::vector<int> Handles() const;

  // Absent or Failed -> Loading on the worker's device.
  void StartLoad(uint32_t device, uint32_t worker, uint64_t job, uint64_t admitted_bytes,
                 uint64_t weight_bytes);
  // Parked -> Unparking on the worker's device.
  void StartUnpark(uint32_t device, uint32_t worker, uint64_t job, uint64_t admitted_bytes);
  // Loading -> Ready, served by the loading worker; the weights are on its device.
  void FinishLoad(Weights weights);
  // Unparking -> Ready with the new device weights (on the unparking worker's device). Returns
  // the host copy's handle (to close).
  int FinishUnpark(Weights weights);
  // Loading -> Absent (a failure of the file or the worker; see Fail for the cooldown).
  void AbandonLoad();
  // Unparking -> Parked: the worker died, the host copy is still held.
  void AbandonUnpark();
  // Unparking -> Absent: the copy could not be attached. Returns the host copy's handle.
  int FailUnpark();
  // Ready: one more replica, attaching on worker (its workspace is accounted from now).
  void AddReplica(uint32_t worker, uint64_t job);
  // Ready or Releasing: the replica's attach is done.
  void ReplicaAttached(uint32_t worker);
  // Ready: the replica takes no new requests; its unload is on its way.
  void ReplicaLeaving(uint32_t worker, uint64_t job);
  // Ready or Releasing: the replica is gone (let go, attach failed, worker died).
  void DropReplica(uint32_t worker);
  // Ready -> Releasing. park: a host copy is made first.
  void StartRelease(bool park);
  // Releasing -> Parked (a copy was made) or Absent/Failed. Returns the weights' handle (to close)
  // and, when the copy is not kept, its handle too.
  std::vector<int> FinishRelease();
  // Parked -> Absent. Returns the host copy's handle (its KV cache's is the caller's to close first).
  int DropParked();
  // Parked, without a KV cache: now with this one (a supervisor before this one kept it).
  void KeepKvCache(KeptKvCache cache);
  // Absent or Failed -> Ready (detached: no replica yet) or Parked, with weights a supervisor
  // before this one held (supervisor/core/kept.h).
  void Adopt(Weights weights, bool parked);
  // Absent -> Failed, or a release under way ends failed.
  void Fail(uint64_t until_ms, std::string reason);
  // Failed -> Absent (its file was looked at again and loads).
  void Recover();
  // The weight bytes shown while the model is not resident (from its registration).
  void SetRegisteredBytes(uint64_t bytes);
  // Writes the record again from the state (after a change inside a state, such as a replica).
  void Publish();

 private:
  void To(Residency next);
  std::vector<Replica>* MutableReplicas();

  shm::ModelIndex* index_ = nullptr;
  uint32_t model_ = 0;
  Residency state_ = residency::Absent{};
  uint64_t registered_bytes_ = 0;
};

template <typename F>
void ModelMachine::ForEachWorker(F&& f) const {
  if (const auto* l = As<residency::Loading>()) return f(l->worker);
  if (const auto* u = As<residency::Unparking>()) return f(u->worker);
  if (const std::vector<Replica>* replicas = Replicas()) {
    for (const Replica& r : *replicas) f(r.worker);
  }
}

}  // namespace warmpool::supervisor
