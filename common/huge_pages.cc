#include "common/huge_pages.h"

#include <unistd.h>

#include <algorithm>
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
  // MAP_FIXED replaces part of the reservation, which is this thread's alone: nothing else can be
  // mapped there. (Before Linux 6.12 a MAP_FIXED that fails may have unmapped that part already,
  // and another thread's mmap could land in the hole before the munmap below: a narrow window
  // for a failure that this mapping of a file we hold open does not meet in practice.)
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
  munmap(reinterpret_cast<void*>(end), start + span - end);  // never empty: 2 MiB more were reserved
  // Before anything touches the pages: with shmem_enabled "advise" they are then allocated in 2 MiB.
  AdviseHugePages(address, bytes);
  return address;
}

bool MakeHugePages(void* address, uint64_t bytes, uint64_t reused) {
  // 23 and 25 from Linux 5.14 and 6.1; Debian 12's headers do not all name MADV_COLLAPSE. Older
  // kernels refuse them (EINVAL), which leaves the pages as they come.
  constexpr int kPopulateWrite = 23;
  constexpr int kCollapse = 25;
  const auto start = reinterpret_cast<uintptr_t>(address);
  uintptr_t first = (start + kHugePageBytes - 1) & ~(kHugePageBytes - 1);
  first = std::max(first, (start + std::min(reused, bytes)) & ~(kHugePageBytes - 1));
  const uintptr_t last = (start + bytes) & ~(kHugePageBytes - 1);
  if (first >= last) return false;
  // The kernel collapses a span only where it finds a page present: one 4 KiB page each (made
  // writable and present without changing what it holds).
  static const auto page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  for (uintptr_t span = first; span < last; span += kHugePageBytes) {
    if (madvise(reinterpret_cast<void*>(span), page, kPopulateWrite) != 0) return false;
  }
  return madvise(reinterpret_cast<void*>(first), last - first, kCollapse) == 0;
}

}  // namespace warmpool
