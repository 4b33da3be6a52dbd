// Admission and eviction as pure functions: which models make room for a load, which are parked
// or dropped, which go beyond max_cached, which expire by keep_alive. The core describes the pool
// (Resident, in LRU order) and acts on the answer; nothing here touches the core or the segment
// (Ray's eviction policy returns victims, the caller evicts them). A new engineer changes the
// eviction policy here, and only here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace warmpool::supervisor::policy {

// One cached model as admission sees it.
struct Resident {
  uint32_t model = 0;
  std::string name;
  enum class Where {
    kDevice,   // ready (or detached): its device bytes can be released
    kSettling, // loading, attaching or unparking: busy for now, evictable later
    kLeaving,  // its release is under way: its bytes come back without a decision of ours
    kParked,   // only a host copy: no device bytes
  };
  Where where = Where::kDevice;
  uint32_t device = 0;        // where its device bytes are (not parked)
  uint64_t device_bytes = 0;  // accounted on the device
  uint64_t parked_bytes = 0;  // the host copy and the KV cache kept with it (parked)
  bool pinned = false;
  bool busy = false;          // requests in flight or waiting: not released now
  uint64_t expires_at_ms = 0; // keep_alive: 0 never
  bool release_when_idle = false;  // keep_alive 0: released as soon as its requests end
};

struct Limits {
  uint64_t budget_bytes = 0;      // device budget; 0 unlimited (PlanPlacement: each device's own)
  uint32_t capacity = 0;          // models on one device at once; 0 unlimited
  uint32_t max_cached = 0;        // on the device plus parked; 0 unlimited
  uint64_t park_budget_bytes = 0; // 0: parking is off
  bool single_active = false;     // capacity is 1 because of [pool] single_active (refusals say so)
};

struct AdmissionPlan {
  enum class Kind {
    kAdmit,   // start the load now
    kEvict,   // release `victims` (idle, unpinned, LRU first), then ask again
    kWait,    // room comes back when busy, settling or leaving models finish: ask again then
    kReject,  // cannot ever fit, or everything in the way is pinned: `reason`
  };
  Kind kind = Kind::kReject;
  std::vector<uint32_t> victims;
  Status reason;
  bool room_coming = false;  // kWait: the releases under way alone make room
  bool sufficient = false;   // kEvict: with the victims released it fits (else busy or pinned
                             // models are still in the way)
  bool by_count = false;     // it fits the bytes: only the count of models (capacity) is in the way
};

// May `model` (needing `bytes` on the device, which holds `used` now) be loaded? `lru` lists the
// cached models of that device and the parked ones, least recently used first (the model itself
// may be among them, parked).
AdmissionPlan PlanAdmission(const std::vector<Resident>& lru, uint32_t model,
                            const std::string& name, uint64_t bytes, uint64_t used,
                            const Limits& limits);

// One device as placement sees it.
inline constexpr uint32_t kNoDevice = 0xFFFFFFFFu;
struct DeviceRoom {
  uint32_t device = 0;
  uint64_t used = 0;
  uint64_t budget = 0;   // 0 unlimited
  bool can_load = false; // usable: not lost for good, and a worker that is not fatal
  bool up = false;       // a worker up now, and the device's memory there
  bool coming = false;   // no worker up, one starting (not one in a crash loop's backoff)
};
struct PlacementPlan {
  uint32_t device = kNoDevice;  // where the plan applies (kAdmit, kEvict, kWait on one device)
  AdmissionPlan plan;
};
// Where a model that holds no device memory goes (a load, an unpark), over every device that can
// load: PlanAdmission on each, with its own residents and budget. In order: admit on the device with
// a worker up that keeps the most room after; wait where room comes without a decision (releases
// under way, so no second eviction for the same load; or a worker starting on a device with room);
// evict, enough to fit, on the device whose victims were used least recently; wait while busy
// models finish; evict what can go where busy or pinned models still stand in the way; reject only
// when every device rejects (the reason of the device with the largest budget). A device with room
// but no worker up or starting (a crash loop's backoff, its memory owner restarting) waits behind
// an eviction elsewhere. `lru` is every cached model, each with its device. With no usable device:
// kWait on kNoDevice.
PlacementPlan PlanPlacement(const std::vector<Resident>& lru, uint32_t model,
                            const std::string& name, uint64_t bytes,
                            const std::vector<DeviceRoom>& devices, const Limits& limits);
// The residents that PlanAdmission weighs for one device: its own and the parked ones.
std::vector<Resident> OnDevice(const std::vector<Resident>& lru, uint32_t device);

// A model leaving the device keeps a host copy when its weights fit what is left of the park
// budget (and it has weights and a worker to copy them); otherwise it is dropped.
bool ShouldPark(uint64_t weight_bytes, bool can_copy, uint64_t park_used, const Limits& limits);

// Beyond max_cached: the least recently used parked copies first, then idle device models; never
// `keep` (just loaded), pinned or busy ones.
std::vector<uint32_t> PlanMaxCached(const std::vector<Resident>& lru, uint32_t keep,
                                    const Limits& limits);

// keep_alive: idle device models past their expiry, never busy or pinned. Never the only cached
// model, nor the most recently used one (a quiet period does not tear down the last warm model:
// the reference's evict_idle), unless its keep_alive is 0: that asks for exactly this teardown
// (Ollama's keep_alive 0), so it is released as soon as its requests end.
std::vector<uint32_t> PlanExpiry(const std::vector<Resident>& lru, uint64_t now_ms);

}  // namespace warmpool::supervisor::policy
