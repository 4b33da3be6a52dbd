// The host backend's kept memory, as descriptors: what the core let go of and counts as kept
// (supervisor/core/kept_memory.h decides what is kept, offered and dropped; this holds the
// descriptors meanwhile, under the core's handle numbers). A kept region is a memfd whose pages
// are allocated and zeroed already: a load offered one writes into those pages instead of faulting
// in fresh ones, as PyTorch's caching allocator does on a GPU.
//
// Only what it holds is ever closed here: an action naming a handle it does not hold (one that
// was never memory it could keep) touches nothing. Workers keep their mappings of kept memory
// (devmem/host_memory.h), so what is closed is named to them by inode (WorkerMappingsGone): only
// then is its memory freed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <unordered_map>
#include <vector>

namespace warmpool::supervisor {

class RegionCache {
 public:
  RegionCache() = default;
  RegionCache(const RegionCache&) = delete;
  RegionCache& operator=(const RegionCache&) = delete;
  ~RegionCache();  // closes what it keeps

  // Takes fd over and keeps it under its number until Take or Drop.
  void Keep(int fd);
  // The kept region `fd` for a job that allocates `bytes`, taken out (the caller owns it), shrunk
  // to `bytes` when larger: when it is memory a job can reuse (a memfd that can be resized: no seals
  // but F_SEAL_SEAL; not empty). Anything else is closed, its inode added to `gone`, and -1
  // returned; -1 too when fd is not kept here.
  int Take(int fd, uint64_t bytes, std::vector<uint64_t>& gone);
  // Closes `fd` when it is kept here; its inode, for the workers' mappings.
  std::optional<uint64_t> Drop(int fd);
  // Closes everything kept; their inodes.
  std::vector<uint64_t> DropAll();

  size_t size() const { return regions_.size(); }

 private:
  std::unordered_map<int, uint64_t> regions_;  // fd -> inode
};

}  // namespace warmpool::supervisor
