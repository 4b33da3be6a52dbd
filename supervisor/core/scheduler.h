// Scheduling decisions as plain functions of the model index: no sockets, no processes, no clock.
// The daemon asks, then acts (Ray's eviction policy returns victims; the caller evicts them), and
// the unit tests ask the same questions of an index laid over a byte vector.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "shm/model_index.h"

namespace warmpool::supervisor {

struct PoolLimits {
  uint32_t capacity = 0;  // models resident on a device at once; 0 = unlimited
};

struct AdmissionPlan {
  enum class Kind {
    kAdmit,   // start the load now
    kEvict,   // unload `victims` (idle, unpinned, LRU first), then ask again
    kWait,    // room will come when busy, loading or unloading models finish; ask again then
    kReject,  // cannot ever fit, or everything in the way is pinned: `reason`
  };
  Kind kind = Kind::kReject;
  std::vector<uint32_t> victims;
  Status reason;
};

// May `model` (needing `bytes` on `device`) be loaded now, and if not, what must happen first?
// Victims are ready, idle (no request in flight), unpinned models other than `model`, least
// recently used first, just enough of them to make room by bytes and by capacity.
AdmissionPlan PlanAdmission(const shm::ModelIndex& index, uint32_t model, uint32_t device,
                            uint64_t bytes, const PoolLimits& limits);

struct WorkerLoad {
  uint32_t slot;
  bool alive;          // hello received and not dead
  uint32_t models;     // models resident in it
  uint32_t outstanding;  // jobs sent and not yet answered
};

// The live worker with the fewest resident models, then the fewest outstanding jobs; kNil if none.
uint32_t PickWorkerForLoad(const std::vector<WorkerLoad>& workers);

}  // namespace warmpool::supervisor
