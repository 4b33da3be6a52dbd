// The driver test double's state and the helpers its calls share (fake_driver.cc: initialisation,
// devices, contexts and virtual memory management; fake_driver_memory.cc: cuMemAlloc's memory,
// legacy IPC handles, host memory, copies and streams). One state per process, behind one mutex,
// as the real driver keeps its own: every call takes it (FAKE_ENTER).
#pragma once

#include <cuda.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace warmpool::fake_cuda {

inline constexpr uint64_t kGranularity = 2u << 20;
inline constexpr uint32_t kIpcMagic = 0x77706970;  // "wpip"

struct Physical {
  int fd = -1;
  uint64_t size = 0;
  int device = 0;
  bool created = false;  // by this process (counted in its device's use), not imported
};

struct Mapping {
  uint64_t size = 0;
  bool writable = false;
  bool accessible = false;
  bool legacy = false;
};

struct IpcHandle {
  uint32_t magic;
  int32_t pid;
  int32_t fd;
  int32_t device;
  uint64_t size;
};
static_assert(sizeof(IpcHandle) <= sizeof(CUipcMemHandle));

struct Injection {
  CUresult code = CUDA_SUCCESS;
  long successes_first = 0;
  long calls = 0;
};

struct State {
  std::mutex mutex;
  bool initialised = false;
  int devices = 1;
  uint64_t memory = 4ull << 30;
  bool fd_handles = true;
  bool read_only = true;
  std::vector<uint64_t> used;
  std::map<std::string, Injection> failures;
  CUmemGenericAllocationHandle next_handle = 1;
  std::map<CUmemGenericAllocationHandle, Physical> handles;
  std::map<uintptr_t, uint64_t> reservations;  // base -> size
  std::map<uintptr_t, Mapping> mappings;       // base -> mapping (VMM, legacy and IPC-opened)
  std::map<uintptr_t, int> legacy_fds;         // cuMemAlloc base -> its memfd
  std::map<void*, size_t> host;                // cuMemHostAlloc
  // Legacy handles opened here, by (exporter pid, its fd): opening one again returns the same
  // pointer and counts, as the driver does.
  std::map<std::pair<int32_t, int32_t>, std::pair<uintptr_t, int>> ipc_opened;
};

inline State& S() {
  static State state;
  return state;
}

inline thread_local int current_device = -1;  // cuCtxSetCurrent's

// The configured failure of this call, if it is due. Caller holds the mutex.
inline CUresult Injected(State& s, const char* call) {
  auto it = s.failures.find(call);
  if (it == s.failures.end()) return CUDA_SUCCESS;
  return it->second.calls++ >= it->second.successes_first ? it->second.code : CUDA_SUCCESS;
}

#define FAKE_ENTER(call)                                        \
  State& s = S();                                               \
  std::lock_guard lock(s.mutex);                                \
  if (!s.initialised) return CUDA_ERROR_NOT_INITIALIZED;        \
  if (CUresult injected = Injected(s, call); injected != CUDA_SUCCESS) return injected

// The mapping that holds [ptr, ptr + bytes), or nullptr.
inline Mapping* Find(State& s, uintptr_t ptr, uint64_t bytes) {
  auto it = s.mappings.upper_bound(ptr);
  if (it == s.mappings.begin()) return nullptr;
  --it;
  if (ptr + bytes > it->first + it->second.size || !it->second.accessible) return nullptr;
  return &it->second;
}

inline int NewMemfd(uint64_t bytes) {
  int fd = memfd_create("fake-cuda", MFD_CLOEXEC);
  if (fd < 0) return -1;
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

inline bool Reserve(uint64_t bytes, uint64_t alignment, uintptr_t* out) {
  if (alignment < kGranularity) alignment = kGranularity;
  void* raw = mmap(nullptr, bytes + alignment, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) return false;
  uintptr_t start = reinterpret_cast<uintptr_t>(raw);
  uintptr_t aligned = (start + alignment - 1) / alignment * alignment;
  if (aligned > start) munmap(raw, aligned - start);
  uintptr_t end = start + bytes + alignment;
  if (end > aligned + bytes) munmap(reinterpret_cast<void*>(aligned + bytes), end - aligned - bytes);
  *out = aligned;
  return true;
}

}  // namespace warmpool::fake_cuda
