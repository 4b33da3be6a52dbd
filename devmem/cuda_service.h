// The cuda backend's device-memory service, as a worker hands it to engines (wp_device_memory).
//
// A worker never creates shareable device memory itself: `alloc` asks the device's owner process
// (through the supervisor, which tracks every grant) and maps what it is granted; `free` unmaps
// and tells the supervisor the grant is no longer needed here. `import` maps weights another
// process loaded, read-only where the driver allows. Every region's handle is a descriptor: the
// exported allocation (vmm), or a small memfd holding the 64-byte CUDA IPC handle (legacy), so the
// supervisor holds either kind as it holds a memfd on the host backend.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

#include "common/status.h"
#include "devmem/cuda_memory.h"
#include "devmem/legacy_handle_fd.h"
#include "warmpool/engine.h"

namespace warmpool {

enum class CudaSharing { kVmm, kLegacy };

// What the owner granted for one alloc: a descriptor (the caller's to keep; the service takes it
// over) naming bytes of device memory, and the grant's id for releasing it.
struct OwnerGrant {
  uint64_t id = 0;
  int fd = -1;
  uint64_t bytes = 0;
};

class CudaMemory {
 public:
  using Allocator = std::function<Result<OwnerGrant>(uint64_t bytes)>;
  using Releaser = std::function<void(uint64_t grant)>;

  // Opens the device (its context current on the calling thread; other threads call
  // MakeCurrent). allocate and release are called from whichever thread allocates or frees.
  static Result<std::unique_ptr<CudaMemory>> Open(int device, CudaSharing sharing, Allocator allocate,
                                                  Releaser release);
  ~CudaMemory();
  CudaMemory(const CudaMemory&) = delete;
  CudaMemory& operator=(const CudaMemory&) = delete;

  const wp_device_memory* service() { return &service_; }
  // Copies host memory into a region: large copies (an unpark) go in chunks over several streams
  // from the host range pinned for the copy, so that they run at the link's speed; small ones are
  // one plain copy. Complete when it returns.
  Status CopyToDevice(const wp_region& region, uint64_t offset, const void* source, uint64_t bytes);
  Status MakeCurrent() const { return device_.MakeCurrent(); }
  const CudaDevice& device() const { return device_; }
  // Regions mapped now (allocated and imported).
  size_t regions() const;
  // The grant behind a region this worker allocated; 0 for an import or an unknown region.
  uint64_t GrantOf(const wp_region& region) const;

 private:
  struct Region {
    std::variant<std::monostate, DeviceMapping, LegacyMapping> mapping;
    int fd = -1;         // the shareable handle, closed with the region
    uint64_t grant = 0;  // non-zero when this worker was granted it (alloc), 0 for an import
    int refs = 1;        // legacy: the driver hands out one pointer per handle and counts opens
  };
  CudaMemory(CudaDevice device, CudaSharing sharing, Allocator allocate, Releaser release);
  // Maps fd (taken over on success) as a region of bytes.
  Result<wp_region> Map(int fd, uint64_t bytes, DeviceAccess access, uint64_t grant);
  void Free(wp_region& region);

  static wp_status CAlloc(void* ctx, uint64_t bytes, wp_region* out);
  static void CFree(void* ctx, wp_region* region);
  static wp_status CImport(void* ctx, int handle, uint64_t bytes, wp_region* out);
  static wp_status CWrite(void* ctx, const wp_region* region, uint64_t offset, const void* source, uint64_t bytes);
  static wp_status CRead(void* ctx, const wp_region* region, uint64_t offset, void* destination, uint64_t bytes);

  CudaDevice device_;
  CudaSharing sharing_;
  std::mutex streams_mutex_;       // one large copy at a time uses the streams
  std::vector<CUstream> streams_;  // created at the first large copy
  Allocator allocate_;
  Releaser release_;
  mutable std::mutex mutex_;
  std::unordered_map<CUdeviceptr, Region> regions_;
  wp_device_memory service_{this, &CudaMemory::CAlloc, &CudaMemory::CFree, 0, &CudaMemory::CImport,
                            &CudaMemory::CWrite, &CudaMemory::CRead};
};

}  // namespace warmpool
