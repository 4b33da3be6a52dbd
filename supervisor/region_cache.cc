#include "supervisor/region_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace warmpool::supervisor {

RegionCache::~RegionCache() { DropAll(); }

void RegionCache::Keep(int fd) {
  if (fd < 0) return;
  struct stat st {};
  regions_[fd] = fstat(fd, &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

int RegionCache::Take(int fd, uint64_t bytes, std::vector<uint64_t>& gone) {
  auto it = regions_.find(fd);
  if (it == regions_.end()) return -1;
  const uint64_t inode = it->second;
  regions_.erase(it);
  struct stat st {};
  // F_GET_SEALS answers only for memfds (and files of shmem that allow sealing): anything else a
  // worker might have sent is not memory to reuse. Nor is a region sealed against resizing.
  const int seals = fcntl(fd, F_GET_SEALS);
  const bool reusable = seals >= 0 && (seals & ~F_SEAL_SEAL) == 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
                        st.st_size > 0;
  // A larger region shrinks now: its tail is counted nowhere once it has left (the core counts
  // `bytes`); a smaller one is grown by the worker.
  if (!reusable || (static_cast<uint64_t>(st.st_size) > bytes && ftruncate(fd, static_cast<off_t>(bytes)) != 0)) {
    close(fd);
    gone.push_back(inode);
    return -1;
  }
  return fd;
}

std::optional<uint64_t> RegionCache::Drop(int fd) {
  auto it = regions_.find(fd);
  if (it == regions_.end()) return std::nullopt;
  const uint64_t inode = it->second;
  regions_.erase(it);
  close(fd);
  return inode;
}

std::vector<uint64_t> RegionCache::DropAll() {
  std::vector<uint64_t> gone;
  for (const auto& [fd, inode] : regions_) {
    close(fd);
    gone.push_back(inode);
  }
  regions_.clear();
  return gone;
}

}  // namespace warmpool::supervisor
