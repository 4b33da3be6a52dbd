// Huge pages for the memory every decode step streams: a model's weights and its KV cache.
//
// Why: a decode step reads every weight once, and a continuous-batching step of several sequences
// does so with enough arithmetic per byte that the reads' stalls show. In 4 KiB pages a 256 MiB
// model's step walks the page tables 65536 times, and the pages lie wherever the allocator found
// them, differently from one daemon start to the next. On a 2-core EPYC VM, 8 streams through the
// daemon decoded at 405 to 418 tokens/s in 4 KiB pages and 433 to 473 in 2 MiB ones, one stream at
// 85 to 89 and 89 to 91 (docs/operations.md, "Huge pages", has the command).
//
// A memfd's pages are shared memory, which gets 2 MiB pages only where the system allows it
// (/sys/kernel/mm/transparent_hugepage/shmem_enabled: "advise" for mappings that ask, as this
// does; "within_size" or "always" for all). Debian's default is "never", which this leaves as it
// is: the advice is only advice, and a kernel that refuses it changes nothing. It must come before
// the pages are touched (faulted in, written or populated): a page's size is chosen when it is
// allocated, and whether a mapping maps a 2 MiB page whole when it is faulted in.
#pragma once

#include <sys/mman.h>

#include <cstdint>

namespace warmpool {

inline void AdviseHugePages(void* address, uint64_t bytes) {
#ifdef MADV_HUGEPAGE
  (void)madvise(address, bytes, MADV_HUGEPAGE);
#else
  (void)address;
  (void)bytes;
#endif
}

}  // namespace warmpool
