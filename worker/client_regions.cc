#include "worker/client_regions.h"

#include <sys/mman.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>

namespace warmpool::worker {

ClientRegions::~ClientRegions() {
  for (auto& [id, m] : maps_) munmap(m.base, m.size);
}

Result<ClientRegions::Mapping> ClientRegions::Map(int fd) {
  struct stat st{};
  if (fd < 0 || fstat(fd, &st) != 0) {
    return Error(Code::kInternal, "the request's region did not come with it");
  }
  Mapping m;
  m.size = static_cast<uint64_t>(st.st_size);
  if (m.size == 0) return Error(Code::kInvalidArgument, "the request's region is empty");
  // Writable for outputs; a client that sealed it against writes since gets a read-only mapping
  // (its outputs then fail). Populated at once: one pass over the page tables.
  m.writable = true;
  void* p = mmap(nullptr, m.size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED && (errno == EPERM || errno == EACCES)) {
    m.writable = false;
    p = mmap(nullptr, m.size, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
  }
  if (p == MAP_FAILED) {
    return Error(Code::kResourceExhausted, "cannot map the request's region ({} bytes): {}", m.size,
                 std::strerror(errno));
  }
  m.base = p;
  return m;
}

Result<char*> ClientRegions::Slice(uint64_t id, int fd, uint64_t offset, uint64_t bytes, bool writable) {
  auto it = maps_.find(id);
  if (it == maps_.end()) {
    Result<Mapping> mapped = Map(fd);
    if (!mapped.ok()) return mapped.status();
    if (maps_.size() >= kMaxMapped) EvictLeastRecentlyUsed();
    it = maps_.emplace(id, *mapped).first;
  }
  Mapping& m = it->second;
  m.last_used = ++uses_;
  if (offset + bytes < offset || offset + bytes > m.size) {
    return Error(Code::kInvalidArgument, "the slice (offset {}, {} bytes) ends past the region's {} bytes",
                 offset, bytes, m.size);
  }
  if (writable && !m.writable) {
    return Error(Code::kFailedPrecondition, "the output's region is sealed against writes");
  }
  return static_cast<char*>(m.base) + offset;
}

void ClientRegions::Forget(uint64_t id) {
  auto it = maps_.find(id);
  if (it == maps_.end()) return;
  munmap(it->second.base, it->second.size);
  maps_.erase(it);
}

void ClientRegions::EvictLeastRecentlyUsed() {
  auto oldest = maps_.begin();
  for (auto it = maps_.begin(); it != maps_.end(); ++it) {
    if (it->second.last_used < oldest->second.last_used) oldest = it;
  }
  if (oldest != maps_.end()) Forget(oldest->first);
}

}  // namespace warmpool::worker
