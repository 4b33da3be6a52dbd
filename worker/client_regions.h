// Clients' shared-memory regions as this worker maps them (WorkerInfer.input_region,
// output_region), by the supervisor's region id. The supervisor sends a region's memfd with every
// request that names it; the first maps the region (its registered size, not the memfd's, which a
// client could make huge) and later ones reuse the mapping, so that a large tensor costs no mmap
// or munmap per request. Only the slices requests name are populated (one pass over their page
// tables), so a worker never faults in more of a client's memory than its requests use; a 2 MiB
// piece a slice covers whole is populated once, not at every request (walking page tables that
// are there already, at every request, cost about as much as the echo itself: docs/benchmarks.md, "Large tensors").
// A mapping lasts until the supervisor says the region is gone (WorkerRegionsGone: removed, or its
// client left), or until it is the least recently used of more than kMaxMapped.
//
// The supervisor checked that the memfd cannot shrink (F_SEAL_SHRINK) below the registered size,
// so the mapping stays backed; slices are checked against that size here too, so a bad slice is an
// error, never a SIGBUS. Reader thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "common/status.h"

namespace warmpool::worker {

class ClientRegions {
 public:
  static constexpr size_t kMaxMapped = 32;

  ClientRegions() = default;
  ClientRegions(const ClientRegions&) = delete;
  ClientRegions& operator=(const ClientRegions&) = delete;
  ~ClientRegions();

  // bytes at offset of region `id` (registered as region_bytes), mapped from fd on first use
  // (fd stays the caller's).
  Result<char*> Slice(uint64_t id, int fd, uint64_t region_bytes, uint64_t offset, uint64_t bytes, bool writable);
  void Forget(uint64_t id);
  size_t mapped() const { return maps_.size(); }

 private:
  struct Mapping {
    void* base = nullptr;
    uint64_t size = 0;
    bool writable = false;
    uint64_t last_used = 0;
    std::vector<uint8_t> populated;  // per kPiece: kRead, kWrite
  };
  static constexpr uint64_t kPiece = 2ull << 20;
  static constexpr uint8_t kRead = 1, kWrite = 2;
  Result<Mapping> Map(int fd, uint64_t region_bytes);
  // Page tables for [start, end) of the mapping (start page-aligned), for reading or writing.
  static void Populate(Mapping& m, uint64_t start, uint64_t end, bool writable);
  void EvictLeastRecentlyUsed();

  std::unordered_map<uint64_t, Mapping> maps_;
  uint64_t uses_ = 0;
};

}  // namespace warmpool::worker
