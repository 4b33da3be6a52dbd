// Device memory the host backend let go of, kept with its pages in memory for the next load: the
// host backend's caching allocator, as PyTorch's is on a GPU. A model's weights (or a parked copy)
// that the core closes are a memfd whose pages are allocated and zeroed already; a load handed one
// of them (action::SendToWorker::allocates, WorkerOffer) writes into those pages instead of
// faulting in fresh ones, which on a VM costs several times the copy itself.
//
// Kept regions are memory the budget promised, not extra: after every batch of actions the shell
// trims the cache to what the device's budget leaves beside what the core counts as used, so that
// used + cached never exceeds the budget; what is trimmed is closed, oldest first. Workers keep
// their mappings of kept memory (devmem/host_memory.h), so what is closed is named to them by
// inode (WorkerMappingsGone): only then is its memory freed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

namespace warmpool::supervisor {

class RegionCache {
 public:
  RegionCache() = default;
  RegionCache(const RegionCache&) = delete;
  RegionCache& operator=(const RegionCache&) = delete;
  ~RegionCache();  // closes what it keeps

  // Takes fd over: kept when it is a memfd that can be resized (no seals but F_SEAL_SEAL) and not
  // empty, closed otherwise.
  void Keep(int fd);
  // The region for an allocation of `bytes` (the caller owns it): the smallest of at least
  // `bytes`, else the largest; -1 when none is kept.
  int Take(uint64_t bytes, uint64_t* size = nullptr);
  // Closes regions, oldest first, until at most `limit` bytes are kept; their inode numbers.
  std::vector<uint64_t> TrimTo(uint64_t limit);

  uint64_t bytes() const { return bytes_; }
  size_t size() const { return regions_.size(); }

 private:
  struct Region {
    int fd = -1;
    uint64_t bytes = 0;
    uint64_t inode = 0;
  };
  std::deque<Region> regions_;  // oldest first
  uint64_t bytes_ = 0;
};

}  // namespace warmpool::supervisor
