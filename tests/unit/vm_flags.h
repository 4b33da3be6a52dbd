// The VmFlags /proc/self/smaps shows for the mapping that holds `address` ("hg": asked for huge
// pages with MADV_HUGEPAGE), or "" when no mapping does.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>

namespace warmpool::testing {

inline std::string VmFlagsOf(const void* address) {
  const auto at = reinterpret_cast<uintptr_t>(address);
  std::ifstream smaps("/proc/self/smaps");
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    unsigned long begin = 0, end = 0;
    // A mapping's first line: "begin-end perms ..."; the lines after it name fields ("Rss:").
    if (std::sscanf(line.c_str(), "%lx-%lx ", &begin, &end) == 2 && line.find(':') > line.find(' ')) {
      inside = begin <= at && at < end;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line.substr(8) + " ";
    }
  }
  return "";
}

// Whether this kernel takes MADV_HUGEPAGE advice and shows it ("hg"): not where it was built
// without transparent huge pages, nor in sandboxes whose /proc shows no VmFlags.
inline bool HugePageAdviceShows() {
  constexpr size_t kBytes = 4 << 20;
  void* p = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return false;
  const bool shows = madvise(p, kBytes, MADV_HUGEPAGE) == 0 && VmFlagsOf(p).find(" hg ") != std::string::npos;
  munmap(p, kBytes);
  return shows;
}

}  // namespace warmpool::testing
