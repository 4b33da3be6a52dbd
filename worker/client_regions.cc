#include "worker/client_regions.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace warmpool::worker {
namespace {

#ifdef MADV_POPULATE_READ
constexpr int kPopulateRead = MADV_POPULATE_READ;
constexpr int kPopulateWrite = MADV_POPULATE_WRITE;
#else  // Linux 5.14; older headers
constexpr int kPopulateRead = 22;
constexpr int kPopulateWrite = 23;
#endif

}  // namespace

ClientRegions::~ClientRegions() {
  for (auto& [id, m] : maps_) munmap(m.base, m.size);
}

Result<ClientRegions::Mapping> ClientRegions::Map(int fd, uint64_t region_bytes) {
  struct stat st{};
  if (fd < 0 || fstat(fd, &st) != 0) {
    return Error(Code::kInternal, "the request's region did not come with it");
  }
  if (region_bytes == 0 || region_bytes > static_cast<uint64_t>(st.st_size)) {
    return Error(Code::kInvalidArgument, "the request's region holds {} bytes, not the {} registered", st.st_size,
                 region_bytes);
  }
  Mapping m;
  m.size = region_bytes;
  // Writable for outputs; a client that sealed it against writes since gets a read-only mapping
  // (its outputs then fail).
  m.writable = true;
  void* p = mmap(nullptr, m.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED && (errno == EPERM || errno == EACCES)) {
    m.writable = false;
    p = mmap(nullptr, m.size, PROT_READ, MAP_SHARED, fd, 0);
  }
  if (p == MAP_FAILED) {
    return Error(Code::kResourceExhausted, "cannot map the request's region ({} bytes): {}", m.size,
                 std::strerror(errno));
  }
  m.base = p;
  m.populated.assign((m.size + kPiece - 1) / kPiece, 0);
  return m;
}

void ClientRegions::Populate(Mapping& m, uint64_t start, uint64_t end, bool writable) {
  const uint8_t want = writable ? kRead | kWrite : kRead;  // a write populate maps for reading too
  for (uint64_t at = start; at < end;) {
    const uint64_t piece = at / kPiece;
    const uint64_t piece_end = std::min(end, (piece + 1) * kPiece);
    const bool whole = at == piece * kPiece && (piece_end == (piece + 1) * kPiece || piece_end == m.size);
    if (!whole || (m.populated[piece] & want) != want) {
      (void)madvise(static_cast<char*>(m.base) + at, piece_end - at, writable ? kPopulateWrite : kPopulateRead);
      if (whole) m.populated[piece] |= want;
    }
    at = piece_end;
  }
}

Result<char*> ClientRegions::Slice(uint64_t id, int fd, uint64_t region_bytes, uint64_t offset, uint64_t bytes,
                                   bool writable) {
  auto it = maps_.find(id);
  if (it == maps_.end()) {
    Result<Mapping> mapped = Map(fd, region_bytes);
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
  // The slice's page tables made in one pass instead of a fault per page while the engine runs
  // (pieces populated before are skipped). Best effort: on a kernel without it, or where the kernel
  // has reclaimed some since, the engine faults them in as it goes.
  static const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  Populate(m, offset / page * page, offset + bytes, writable);
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
