// Host backend of the device-memory service: every region is a memfd, sized with ftruncate and
// mapped shared, so that its fd is a shareable handle another process can map (O(1), no copy).
// Allocations are counted against a byte budget; exceeding it is RESOURCE_EXHAUSTED, as on a GPU.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <vector>

#include "common/status.h"
#include "warmpool/engine.h"

namespace warmpool {

struct HostRegion {
  void* ptr = nullptr;
  uint64_t bytes = 0;
  int fd = -1;
};

class HostMemory {
 public:
  // budget_bytes 0 = unlimited.
  explicit HostMemory(uint64_t budget_bytes = 0) : budget_(budget_bytes) {}
  HostMemory(const HostMemory&) = delete;
  HostMemory& operator=(const HostMemory&) = delete;
  ~HostMemory();  // unmaps the mappings it keeps

  Result<HostRegion> Allocate(uint64_t bytes, const char* label);
  // The same, in a region that held device memory before (a memfd the supervisor kept after it
  // was let go, supervisor/region_cache.h): resized to `bytes` and mapped with its pages populated in
  // one call, so a load into it pays neither page allocation nor a fault per page. Takes `fd`
  // over (closed on failure, when the caller falls back to Allocate). Where this process still
  // maps that memory from before (KeepMappingOf), the mapping is used again as it is: no page
  // table to make (on this VM most of a load into kept memory), and none to tear down before.
  Result<HostRegion> AllocateReusing(int fd, uint64_t bytes);
  // The region of `fd` (allocated here) was handed to the supervisor, which keeps its memory for
  // reuse when it is let go: Free then keeps the mapping (at most kKeptMappings, oldest unmapped
  // first) instead of unmapping it, until ForgetMappings names it or AllocateReusing takes it.
  void KeepMappingOf(int fd);
  // The supervisor closed these regions (by inode): their kept mappings go, and their memory with
  // them.
  void ForgetMappings(const std::vector<uint64_t>& inodes);
  size_t kept_mappings();
  static constexpr size_t kKeptMappings = 4;
  // Host memory outside the device budget (parked copies): a memfd of the region's bytes, read
  // from it through its device's service (a memcpy on the host backend, a copy from the GPU on
  // cuda). Returns its fd; nothing stays mapped here.
  // reuse_fd: memory to copy into instead of a fresh memfd (taken over), as AllocateReusing.
  // Copies of host memory go in chunks of this size over up to this many threads (common/chunks.h).
  static constexpr uint64_t kCopyChunkBytes = 16ull << 20;
  static constexpr unsigned kCopyThreads = 4;
  // Imports at least this large fill their page tables from those threads too (Import).
  static constexpr uint64_t kParallelPopulateBytes = 64ull << 20;
  static Result<int> CopyToHost(const wp_device_memory& device, const wp_region& region, int reuse_fd = -1);
  // The same into a fresh memfd sealed against resizing once written (what a KV region's reader
  // demands: engines/transformer/kv_region.h): a GPU's KV pool parked with its model.
  static Result<int> CopyToSealedHost(const wp_device_memory& device, const wp_region& region);
  // Maps a region exported by another process: a dup of its fd, mapped shared; read-only and
  // populated unless `read_only` is false (a copy a GPU driver pins for a transfer). Not counted
  // against this process's budget: the supervisor accounts shared weights once, where it holds
  // them. The service's `write` refuses read-only imported regions (the service imports so).
  Result<HostRegion> Import(int fd, uint64_t bytes, bool read_only = true);
  // Whether ptr lies in a read-only imported mapping.
  bool ReadOnly(const void* ptr);
  void Free(HostRegion& region);

  uint64_t used_bytes() const { return used_.load(std::memory_order_relaxed); }
  uint64_t budget_bytes() const { return budget_; }

  // The C view handed to engines; valid as long as this object lives.
  const wp_device_memory* service() { return &service_; }

 private:
  static wp_status CAlloc(void* ctx, uint64_t bytes, wp_region* out);
  static void CFree(void* ctx, wp_region* region);
  static wp_status CImport(void* ctx, int handle, uint64_t bytes, wp_region* out);
  static wp_status CWrite(void* ctx, const wp_region* region, uint64_t offset, const void* source, uint64_t bytes);
  static wp_status CRead(void* ctx, const wp_region* region, uint64_t offset, void* destination, uint64_t bytes);

  uint64_t budget_;
  std::atomic<uint64_t> used_{0};
  std::mutex imported_mutex_;
  struct ImportedMapping {
    uint64_t bytes = 0;
    bool read_only = false;
  };
  // Mappings made by Import, by start: freed without touching used_; write refuses read-only ones.
  std::map<uintptr_t, ImportedMapping> imported_;
  struct KeptMapping {
    uint64_t inode = 0;
    void* ptr = nullptr;
    uint64_t bytes = 0;
  };
  // Counts `bytes` as used, or says why not (the budget, or 0 bytes).
  Status Reserve(uint64_t bytes);
  // Takes the kept mapping of `inode` out of the cache, or returns one with a null ptr.
  KeptMapping TakeKeptMapping(uint64_t inode);
  // The kept mapping of `inode` resized to `bytes`, or null when there is none.
  void* ReuseKeptMapping(uint64_t inode, uint64_t bytes);
  std::mutex kept_mutex_;
  std::set<uint64_t> handed_over_;   // inodes of regions the supervisor holds (KeepMappingOf)
  std::deque<KeptMapping> kept_;     // oldest first
  wp_device_memory service_{this, &HostMemory::CAlloc, &HostMemory::CFree, 1, &HostMemory::CImport,
                            &HostMemory::CWrite, &HostMemory::CRead};
};

}  // namespace warmpool
