#include "supervisor/region_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace warmpool::supervisor {

RegionCache::~RegionCache() { TrimTo(0); }

void RegionCache::Keep(int fd) {
  if (fd < 0) return;
  struct stat st {};
  // F_GET_SEALS answers only for memfds (and files of shmem that allow sealing): anything else a
  // worker might have sent is closed. A region sealed against resizing cannot be reused either.
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & ~F_SEAL_SEAL) != 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0) {
    close(fd);
    return;
  }
  regions_.push_back({fd, static_cast<uint64_t>(st.st_size), static_cast<uint64_t>(st.st_ino)});
  bytes_ += static_cast<uint64_t>(st.st_size);
}

int RegionCache::Take(uint64_t bytes, uint64_t* size) {
  if (regions_.empty()) return -1;
  auto best = regions_.end();
  auto largest = regions_.begin();
  for (auto it = regions_.begin(); it != regions_.end(); ++it) {
    if (it->bytes >= bytes && (best == regions_.end() || it->bytes < best->bytes)) best = it;
    if (it->bytes > largest->bytes) largest = it;
  }
  auto chosen = best != regions_.end() ? best : largest;
  const int fd = chosen->fd;
  if (size != nullptr) *size = chosen->bytes;
  bytes_ -= chosen->bytes;
  regions_.erase(chosen);
  return fd;
}

std::vector<uint64_t> RegionCache::TrimTo(uint64_t limit) {
  std::vector<uint64_t> closed;
  while (bytes_ > limit && !regions_.empty()) {
    bytes_ -= regions_.front().bytes;
    close(regions_.front().fd);
    closed.push_back(regions_.front().inode);
    regions_.pop_front();
  }
  return closed;
}

}  // namespace warmpool::supervisor
