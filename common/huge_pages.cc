#include "common/huge_pages.h"

#include <unistd.h>

#include <cerrno>
#include <cstdint>

namespace warmpool {

void* MapShared(int fd, uint64_t bytes, int prot, int flags) {
  if (bytes < kHugePageBytes) {
    void* address = mmap(nullptr, bytes, prot, MAP_SHARED | flags, fd, 0);
    if (address != MAP_FAILED) AdviseHugePages(address, bytes);
    return address;
  }
  // Reserve 2 MiB more address space than the mapping needs (no memory behind it), map the file
  // over the first aligned address in it, and give back what is left on either side.
  const uint64_t span = bytes + kHugePageBytes;
  void* reserved = mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (reserved == MAP_FAILED) return MAP_FAILED;
  const auto start = reinterpret_cast<uintptr_t>(reserved);
  const uintptr_t aligned = (start + kHugePageBytes - 1) & ~(kHugePageBytes - 1);
  void* address = mmap(reinterpret_cast<void*>(aligned), bytes, prot, MAP_SHARED | MAP_FIXED | flags, fd, 0);
  if (address == MAP_FAILED) {
    const int err = errno;
    munmap(reserved, span);
    errno = err;
    return MAP_FAILED;
  }
  static const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t end = aligned + (bytes + page - 1) / page * page;
  if (aligned > start) munmap(reserved, aligned - start);
  if (start + span > end) munmap(reinterpret_cast<void*>(end), start + span - end);
  // Before anything touches the pages: with shmem_enabled "advise" they are then allocated in 2 MiB.
  AdviseHugePages(address, bytes);
  return address;
}

bool MakeHugePages(void* address, uint64_t bytes) {
#if defined(MADV_POPULATE_WRITE)
  // MADV_COLLAPSE is 25 from Linux 6.1; Debian 12's headers do not all name it.
  constexpr int kCollapse = 25;
  const auto start = reinterpret_cast<uintptr_t>(address);
  const uintptr_t first = (start + kHugePageBytes - 1) & ~(kHugePageBytes - 1);
  const uintptr_t last = (start + bytes) & ~(kHugePageBytes - 1);
  if (first >= last) return false;
  // The kernel collapses a span only where it finds a page present: one 4 KiB page each (made
  // writable and present without changing what it holds).
  static const auto page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  for (uintptr_t span = first; span < last; span += kHugePageBytes) {
    if (madvise(reinterpret_cast<void*>(span), page, MADV_POPULATE_WRITE) != 0) return false;
  }
  return madvise(reinterpret_cast<void*>(first), last - first, kCollapse) == 0;
#else
  (void)address;
  (void)bytes;
  return false;
#endif
}

}  // namespace warmpool
