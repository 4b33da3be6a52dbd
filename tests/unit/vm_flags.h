// What /proc/self/smaps shows of a mapping: its VmFlags ("hg": asked for huge pages with
// MADV_HUGEPAGE), and how much of it is mapped in 2 MiB pages.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

namespace warmpool::testing {

// The rest of the line of `field` ("VmFlags:", "ShmemPmdMapped:") in /proc/self/smaps for the
// mapping that holds `address`, or "" when no mapping does.
inline std::string SmapsField(const void* address, const std::string& field) {
  const auto at = reinterpret_cast<uintptr_t>(address);
  std::ifstream smaps("/proc/self/smaps");
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    unsigned long begin = 0, end = 0;
    // A mapping's first line: "begin-end perms ..."; the lines after it name fields ("Rss:").
    if (std::sscanf(line.c_str(), "%lx-%lx ", &begin, &end) == 2 && line.find(':') > line.find(' ')) {
      inside = begin <= at && at < end;
    } else if (inside && line.rfind(field, 0) == 0) {
      return line.substr(field.size());
    }
  }
  return "";
}

inline std::string VmFlagsOf(const void* address) {
  const std::string flags = SmapsField(address, "VmFlags:");
  return flags.empty() ? flags : flags + " ";
}

// KiB of the mapping that holds `address` mapped in whole 2 MiB pages of shared memory.
inline uint64_t ShmemPmdMappedKiB(const void* address) {
  return std::strtoull(SmapsField(address, "ShmemPmdMapped:").c_str(), nullptr, 10);
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
