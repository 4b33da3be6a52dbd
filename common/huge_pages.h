// Huge pages for the memory every decode step streams: a model's weights and its KV cache.
//
// Why: a decode step reads every weight once, and a continuous-batching step of several sequences
// does so with enough arithmetic per byte that the reads' stalls show. In 4 KiB pages a 256 MiB
// model's step walks the page tables 65536 times, and the pages lie wherever the allocator found
// them, differently from one daemon start to the next. On a 2-core EPYC VM, 8 streams through the
// daemon decoded at 391 to 403 tokens/s with the weights in 4 KiB pages and 438 to 493 in 2 MiB
// ones, one stream at 85 to 90 and 92 to 94 (docs/operations.md, "Huge pages", has the command).
//
// A memfd's pages are shared memory, which the kernel gives 2 MiB pages as they are faulted in only
// where /sys/kernel/mm/transparent_hugepage/shmem_enabled allows it ("advise" for mappings that ask,
// "within_size" or "always" for all). Debian's default is "never". So a region gets them in two
// ways, both best effort (a kernel that refuses changes nothing but the page size):
//   - every mapping asks (MADV_HUGEPAGE), before its pages are touched: a page's size is chosen
//     when it is allocated, and whether a mapping maps a 2 MiB page whole when it is faulted in;
//   - the writer of a region about to be filled asks for them outright (MADV_COLLAPSE, Linux 6.1),
//     which the kernel grants unless shmem_enabled is "deny", the process or mapping opted out of
//     huge pages, or it has none free. Asked while the region is still empty, this costs one 4 KiB
//     page each 2 MiB and the kernel's zeroing of the rest, usually less than faulting the region
//     in 4 KiB pages as it is written; but the kernel reclaims and compacts memory for them on the
//     asking thread where it must, which can take longer. A region reused (memory the supervisor
//     kept) is asked for them only where it grew: what it held is overwritten, and copying it into
//     2 MiB pages first would cost a copy.
// And a 2 MiB page is mapped whole only at a 2 MiB-aligned address, which the kernel chooses for
// shared memory only where shmem_enabled allows huge pages: MapShared aligns it itself.
#pragma once

#include <sys/mman.h>

#include <cstdint>

namespace warmpool {

inline constexpr uint64_t kHugePageBytes = uint64_t{2} << 20;

// mmap(nullptr, bytes, prot, MAP_SHARED | flags, fd, 0) at a 2 MiB-aligned address where bytes
// span one, asking for 2 MiB pages; MAP_FAILED and errno as mmap's.
void* MapShared(int fd, uint64_t bytes, int prot, int flags = 0);

inline void AdviseHugePages(void* address, uint64_t bytes) {
#ifdef MADV_HUGEPAGE
  (void)madvise(address, bytes, MADV_HUGEPAGE);
#else
  (void)address;
  (void)bytes;
#endif
}

// For the writer of a writable shared mapping (MapShared's) about to fill it: its whole 2 MiB spans
// become 2 MiB pages where the kernel grants them, but those that lie wholly within its first
// `reused` bytes (a region used before, whose pages are left as they are). Keeps what the region
// holds (what a span holds is copied into its new page: cheap only while it is empty). True where
// the kernel made them all.
bool MakeHugePages(void* address, uint64_t bytes, uint64_t reused = 0);

}  // namespace warmpool
