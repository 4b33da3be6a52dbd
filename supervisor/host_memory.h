// The host backend's memory between models: what the core let go of (a released model's weights,
// a parked copy that was unparked or dropped) is kept, up to what the budget leaves, and handed to
// the next job that allocates (supervisor/region_cache.h), so that a switch under a full budget
// reuses the pages the eviction freed instead of faulting fresh ones in.
//
// used + kept never passes the budget: Trim runs after every batch of the core's actions. Memory
// a worker may still map is named to every worker when it goes (mappings_gone), so that no
// mapping outlives the memory's last use here.
#pragma once

#include <cstdint>
#include <vector>

#include "supervisor/device_backend.h"
#include "supervisor/region_cache.h"

namespace warmpool::supervisor {

class HostMemory final : public DeviceBackend {
 public:
  HostMemory() = default;
  HostMemory(const HostMemory&) = delete;
  HostMemory& operator=(const HostMemory&) = delete;

  Status Start(WorkerPool* workers) override;
  void Shutdown() override {}
  // Job `job` on worker `slot` allocates `bytes`, which the core has just counted as used: the
  // kept region that best fits is taken before trimming (under a full budget it is the very
  // region the eviction for this job freed), shrunk to `bytes`, and offered with the frame.
  void BeforeAllocatingJob(uint32_t slot, uint64_t job, uint64_t bytes, const shm::ModelIndex& index) override;
  // Keeps at most what the budget leaves (the host backend has one device).
  void AfterActions(const shm::ModelIndex& index) override;
  // Kept when `reusable`, else closed (and named to the workers).
  void Release(int fd, bool reusable) override;
  // Nothing kept is reused (the daemon's releases are not reusable from here on either).
  void HandedOver() override;
  // The memory kept for reuse, as device 0's kept bytes and regions.
  void Describe(v1::StatusReply& status) const override;
  // Device memory is granted on the cuda backend only: an allocation is refused.
  bool OnWorkerMessage(uint32_t slot, const v1::WorkerEnvelope& message) override;
  void OnWeights(uint32_t slot, const v1::WorkerLoadDone& done, int fd) override;
  void OnWorkerGone(uint32_t, uint32_t) override {}

 private:
  void Trim(uint64_t used, uint64_t budget);
  void ForgetMappings(const std::vector<uint64_t>& inodes);

  WorkerPool* workers_ = nullptr;
  RegionCache cache_;
};

}  // namespace warmpool::supervisor
