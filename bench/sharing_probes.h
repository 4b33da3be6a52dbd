// Measurements of the machine itself, for the --sharing baselines: spreads of timings, `cat` of a
// file, memcpy into fresh and reused memory, and a process's proportional set size.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "bench/stats.h"
#include "common/status.h"

namespace warmpool::bench::probes {

using Clock = std::chrono::steady_clock;

inline uint64_t Ns(Clock::duration d) {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(d).count());
}

inline constexpr const char* kCat = "/bin/cat";


// GB/s (10^9 bytes per second) of bytes moved in ms.
inline double Throughput(uint64_t bytes, double ms) { return ms > 0 ? bytes / (ms * 1e6) : 0; }

inline double MiB(uint64_t bytes) { return bytes / 1048576.0; }

// Fork + exec of `/bin/cat path` with stdout on /dev/null; wall time from fork to reap.
inline Result<uint64_t> TimeCat(const std::string& path) {
  auto t0 = Clock::now();
  pid_t pid = fork();
  if (pid < 0) return Error(Code::kInternal, "fork: {}", std::strerror(errno));
  if (pid == 0) {
    int null_fd = open("/dev/null", O_WRONLY);
    if (null_fd < 0) _exit(126);
    dup2(null_fd, STDOUT_FILENO);
    char* const argv[] = {const_cast<char*>("cat"), const_cast<char*>(path.c_str()), nullptr};
    execv(kCat, argv);
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return Error(Code::kInternal, "waitpid: {}", std::strerror(errno));
  }
  auto t1 = Clock::now();
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return Error(Code::kInternal, "{} {} failed (wait status {})", kCat, path, status);
  }
  return Ns(t1 - t0);
}

struct MemoryUse {
  uint64_t pss_bytes = 0;
  uint64_t rss_bytes = 0;
  uint64_t pss_shmem_bytes = 0;  // 0 where the kernel does not break it out
};

// /proc/PID/smaps_rollup: Pss, Rss and Pss_Shmem (kB in the file).
inline Result<MemoryUse> ReadMemoryUse(pid_t pid) {
  std::string path = fmt::format("/proc/{}/smaps_rollup", pid);
  std::ifstream in(path);
  if (!in) return Error(Code::kInternal, "cannot read {}", path);
  MemoryUse use;
  bool pss_seen = false;
  std::string line;
  while (std::getline(in, line)) {
    auto field = [&](const char* name, uint64_t& out) {
      size_t n = std::strlen(name);
      if (line.compare(0, n, name) != 0) return false;
      out = std::strtoull(line.c_str() + n, nullptr, 10) * 1024;
      return true;
    };
    if (field("Pss:", use.pss_bytes)) pss_seen = true;
    field("Rss:", use.rss_bytes);
    field("Pss_Shmem:", use.pss_shmem_bytes);
  }
  if (!pss_seen) return Error(Code::kInternal, "no Pss: line in {}", path);
  return use;
}

// ---- memcpy baselines for the unpark phase ----

// An anonymous private mapping of `bytes`, not touched (every page faults on first write). mmap
// rather than malloc: glibc serves a large malloc with mmap too, but its dynamic mmap threshold
// (up to 32 MiB) would soon hand back an already-faulted heap block for the 16 MiB size.
inline Result<void*> MapAnonymous(uint64_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return Error(Code::kInternal, "mmap {} bytes: {}", bytes, std::strerror(errno));
  }
  return p;
}

// memcpy of bytes into a freshly mapped anonymous buffer: the copy itself faults the pages in.
// Timed from the allocation to the end of the copy; the unmap is not timed.
inline Result<uint64_t> TimeMemcpyFresh(const void* source, uint64_t bytes) {
  auto t0 = Clock::now();
  Result<void*> dst = MapAnonymous(bytes);
  if (!dst.ok()) return dst.status();
  std::memcpy(*dst, source, bytes);
  auto t1 = Clock::now();
  munmap(*dst, bytes);
  return Ns(t1 - t0);
}

// The same into a fresh memfd region, created, sized and mapped the way the host backend allocates
// "device memory" (what an unpark copies into). Timed from memfd_create to the end of the copy.
inline Result<uint64_t> TimeMemcpyMemfd(const void* source, uint64_t bytes) {
  auto t0 = Clock::now();
  int fd = memfd_create("warmpool-bench-copy", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return Error(Code::kInternal, "memfd_create: {}", std::strerror(errno));
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    int err = errno;
    close(fd);
    return Error(Code::kInternal, "ftruncate memfd to {} bytes: {}", bytes, std::strerror(err));
  }
  void* dst = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (dst == MAP_FAILED) {
    int err = errno;
    close(fd);
    return Error(Code::kInternal, "mmap memfd {} bytes: {}", bytes, std::strerror(err));
  }
  std::memcpy(dst, source, bytes);
  auto t1 = Clock::now();
  munmap(dst, bytes);
  close(fd);
  return Ns(t1 - t0);
}

// memcpy into a buffer that is already mapped and faulted (reused from the previous copy).
inline uint64_t TimeMemcpyReused(void* dst, const void* source, uint64_t bytes) {
  auto t0 = Clock::now();
  std::memcpy(dst, source, bytes);
  auto t1 = Clock::now();
  // Keep the copy from being dropped as dead: read one byte of it.
  volatile unsigned char sink = static_cast<unsigned char*>(dst)[bytes / 2];
  (void)sink;
  return Ns(t1 - t0);
}

// Owns an anonymous mapping (the source and the reused destination of the baselines).
struct Mapping {
  void* ptr = nullptr;
  uint64_t bytes = 0;
  Mapping() = default;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    if (ptr != nullptr) munmap(ptr, bytes);
  }
};

// Occurrences of needle in the file (the daemon log).
inline uint64_t CountInFile(const std::string& path, const std::string& needle) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return 0;
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  uint64_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// ---- per-size results ----

}  // namespace warmpool::bench::probes
