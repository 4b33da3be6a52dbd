// Device memory granted in this process: the worker's memory service (CudaMemory) on one device,
// each grant an allocation made here as warmpool-owner would make it, so that a test or a check
// plays both parts in one process.
#pragma once

#include <map>
#include <memory>
#include <mutex>

#include "devmem/cuda_memory.h"
#include "devmem/cuda_service.h"

namespace warmpool {

class InProcessCudaMemory {
 public:
  static Result<std::unique_ptr<InProcessCudaMemory>> Open(int device) {
    auto self = std::unique_ptr<InProcessCudaMemory>(new InProcessCudaMemory());
    InProcessCudaMemory* raw = self.get();
    Result<std::unique_ptr<CudaMemory>> memory = CudaMemory::Open(
        device, CudaSharing::kVmm,
        [raw](uint64_t bytes) -> Result<OwnerGrant> {
          std::lock_guard<std::mutex> lock(raw->mutex_);
          Result<DeviceAllocation> allocation = DeviceAllocation::Create(raw->memory_->device(), bytes);
          if (!allocation.ok()) return allocation.status();
          Result<int> fd = allocation->Export();
          if (!fd.ok()) return fd.status();
          const uint64_t id = raw->next_++;
          const uint64_t granted = allocation->bytes();
          raw->allocations_.emplace(id, std::move(*allocation));
          return OwnerGrant{id, *fd, granted};
        },
        [raw](uint64_t grant) {
          std::lock_guard<std::mutex> lock(raw->mutex_);
          raw->allocations_.erase(grant);
        });
    if (!memory.ok()) return memory.status();
    self->memory_ = std::move(*memory);
    return self;
  }
  // The memory service goes first: it releases its grants, which erase their allocations.
  ~InProcessCudaMemory() { memory_.reset(); }

  const wp_device_memory* service() const { return memory_->service(); }
  CudaMemory& memory() { return *memory_; }
  size_t grants() {
    std::lock_guard<std::mutex> lock(mutex_);
    return allocations_.size();
  }

 private:
  InProcessCudaMemory() = default;
  std::mutex mutex_;
  std::map<uint64_t, DeviceAllocation> allocations_;
  uint64_t next_ = 1;
  std::unique_ptr<CudaMemory> memory_;
};

}  // namespace warmpool
