// The host backend's device memory is host memory: memfd regions the workers allocate. What the
// core let go of and counts as kept (supervisor/core/kept_memory.h) is held here (region_cache.h)
// and offered to the job the core names, so that a switch under a full budget reuses the pages
// the eviction freed instead of faulting fresh ones in. The core decides; this only carries it out.
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
  // Kept when `keep` (and no takeover has happened), else closed and named to the workers.
  void Release(int fd, bool keep) override;
  // Sends the kept region, shrunk to `bytes`, as a WorkerOffer for the job.
  void Offer(uint32_t slot, uint64_t job, uint64_t bytes, int fd) override;
  void DropKept(int fd) override;
  // Everything kept goes, and nothing is kept from now on.
  void HandedOver() override;
  // Device memory is granted on the cuda backend only: an allocation is refused.
  bool OnWorkerMessage(uint32_t slot, const v1::WorkerEnvelope& message) override;
  void OnKept(uint32_t slot, uint64_t grant, int fd, const char* what) override;
  void OnWorkerGone(uint32_t, uint32_t) override {}

 private:
  void ForgetMappings(const std::vector<uint64_t>& inodes);

  WorkerPool* workers_ = nullptr;
  RegionCache cache_;
  bool handed_over_ = false;
};

}  // namespace warmpool::supervisor
