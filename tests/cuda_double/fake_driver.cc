// A test double of the CUDA driver API: built as libcuda.so.1 and put in front of the real one with
// LD_LIBRARY_PATH, so that everything the cuda backend does outside GPU kernels runs on machines
// without a GPU. It implements exactly the calls in WARMPOOL_CUDA_DRIVER_CALLS (devmem/cuda_driver.h),
// compiled against the toolkit's cuda.h so that every signature is the real one.
//
// Device memory is host memory: a physical allocation is a memfd, "device pointers" are addresses in
// this process, an exported handle is a dup of the memfd. Access rights are real (mprotect): a range
// mapped without cuMemSetAccess, or read-only, cannot be written. Legacy IPC handles name the
// exporter's memfd by (pid, fd), opened through /proc, so they stop working when the exporter dies.
//
// Configuration, read at cuInit:
//   WARMPOOL_FAKE_CUDA_DEVICES     devices (default 1; 0 makes cuInit fail with CUDA_ERROR_NO_DEVICE)
//   WARMPOOL_FAKE_CUDA_MEMORY      bytes per device (default 4 GiB)
//   WARMPOOL_FAKE_CUDA_FD_HANDLES  0: no POSIX descriptor export (legacy IPC only)
//   WARMPOOL_FAKE_CUDA_READ_ONLY   0: read-only access is refused with CUDA_ERROR_NOT_SUPPORTED
//   WARMPOOL_FAKE_CUDA_FAIL        "cuMemCreate=2,cuMemMap=1@3": call=CUresult[@successes first]
//
// What it cannot show: anything about GPU kernels, real device memory limits shared between
// processes (memory is counted per process, by the process that created it), timing, peer access,
// or whether a VMM allocation outlives its creator on a real driver (a memfd always does).
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

namespace {

constexpr uint64_t kGranularity = 2u << 20;
constexpr uint32_t kIpcMagic = 0x77706970;  // "wpip"

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

State& S() {
  static State state;
  return state;
}

thread_local int current_device = -1;

long EnvLong(const char* name, long fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? std::strtol(value, nullptr, 0) : fallback;
}

void ParseFailures(State& s) {
  const char* spec = std::getenv("WARMPOOL_FAKE_CUDA_FAIL");
  if (spec == nullptr) return;
  std::string all(spec);
  size_t start = 0;
  while (start < all.size()) {
    size_t end = all.find(',', start);
    if (end == std::string::npos) end = all.size();
    std::string item = all.substr(start, end - start);
    size_t eq = item.find('=');
    if (eq != std::string::npos) {
      Injection injection;
      std::string rest = item.substr(eq + 1);
      size_t at = rest.find('@');
      injection.code = static_cast<CUresult>(std::strtol(rest.substr(0, at).c_str(), nullptr, 0));
      if (at != std::string::npos) injection.successes_first = std::strtol(rest.c_str() + at + 1, nullptr, 0);
      s.failures[item.substr(0, eq)] = injection;
    }
    start = end + 1;
  }
}

// The configured failure of this call, if it is due. Caller holds the mutex.
CUresult Injected(State& s, const char* call) {
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
Mapping* Find(State& s, uintptr_t ptr, uint64_t bytes) {
  auto it = s.mappings.upper_bound(ptr);
  if (it == s.mappings.begin()) return nullptr;
  --it;
  if (ptr + bytes > it->first + it->second.size || !it->second.accessible) return nullptr;
  return &it->second;
}

int NewMemfd(uint64_t bytes) {
  int fd = memfd_create("fake-cuda", MFD_CLOEXEC);
  if (fd < 0) return -1;
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

bool Reserve(uint64_t bytes, uint64_t alignment, uintptr_t* out) {
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

}  // namespace

extern "C" {

CUresult CUDAAPI cuInit(unsigned int) {
  State& s = S();
  std::lock_guard lock(s.mutex);
  if (!s.initialised) {
    s.devices = static_cast<int>(EnvLong("WARMPOOL_FAKE_CUDA_DEVICES", 1));
    s.memory = static_cast<uint64_t>(EnvLong("WARMPOOL_FAKE_CUDA_MEMORY", 4l << 30));
    s.fd_handles = EnvLong("WARMPOOL_FAKE_CUDA_FD_HANDLES", 1) != 0;
    s.read_only = EnvLong("WARMPOOL_FAKE_CUDA_READ_ONLY", 1) != 0;
    ParseFailures(s);
    s.used.assign(s.devices > 0 ? s.devices : 0, 0);
  }
  if (CUresult injected = Injected(s, "cuInit"); injected != CUDA_SUCCESS) return injected;
  if (s.devices <= 0) return CUDA_ERROR_NO_DEVICE;
  s.initialised = true;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDriverGetVersion(int* version) {
  *version = static_cast<int>(EnvLong("WARMPOOL_FAKE_CUDA_DRIVER_VERSION", CUDA_VERSION));
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGetErrorName(CUresult error, const char** text) {
  switch (error) {
#define FAKE_NAME(e) case e: *text = #e; return CUDA_SUCCESS;
    FAKE_NAME(CUDA_SUCCESS) FAKE_NAME(CUDA_ERROR_INVALID_VALUE) FAKE_NAME(CUDA_ERROR_OUT_OF_MEMORY)
    FAKE_NAME(CUDA_ERROR_NOT_INITIALIZED) FAKE_NAME(CUDA_ERROR_NO_DEVICE) FAKE_NAME(CUDA_ERROR_INVALID_DEVICE)
    FAKE_NAME(CUDA_ERROR_INVALID_CONTEXT) FAKE_NAME(CUDA_ERROR_INVALID_HANDLE) FAKE_NAME(CUDA_ERROR_NOT_SUPPORTED)
    FAKE_NAME(CUDA_ERROR_ILLEGAL_ADDRESS) FAKE_NAME(CUDA_ERROR_UNKNOWN) FAKE_NAME(CUDA_ERROR_DEVICE_UNAVAILABLE)
    FAKE_NAME(CUDA_ERROR_NOT_PERMITTED)
#undef FAKE_NAME
    default: *text = nullptr; return CUDA_ERROR_INVALID_VALUE;
  }
}

CUresult CUDAAPI cuGetErrorString(CUresult error, const char** text) {
  switch (error) {
    case CUDA_SUCCESS: *text = "no error"; return CUDA_SUCCESS;
    case CUDA_ERROR_OUT_OF_MEMORY: *text = "out of memory"; return CUDA_SUCCESS;
    case CUDA_ERROR_NO_DEVICE: *text = "no CUDA-capable device is detected"; return CUDA_SUCCESS;
    case CUDA_ERROR_INVALID_VALUE: *text = "invalid argument"; return CUDA_SUCCESS;
    case CUDA_ERROR_ILLEGAL_ADDRESS: *text = "an illegal memory access was encountered"; return CUDA_SUCCESS;
    default: return cuGetErrorName(error, text);
  }
}

CUresult CUDAAPI cuDeviceGetCount(int* count) {
  FAKE_ENTER("cuDeviceGetCount");
  *count = s.devices;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGet(CUdevice* device, int ordinal) {
  FAKE_ENTER("cuDeviceGet");
  if (ordinal < 0 || ordinal >= s.devices) return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetName(char* name, int len, CUdevice device) {
  FAKE_ENTER("cuDeviceGetName");
  if (device < 0 || device >= s.devices) return CUDA_ERROR_INVALID_DEVICE;
  std::snprintf(name, static_cast<size_t>(len), "warmpool CUDA test double %d", device);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceTotalMem(size_t* bytes, CUdevice device) {
  FAKE_ENTER("cuDeviceTotalMem");
  if (device < 0 || device >= s.devices) return CUDA_ERROR_INVALID_DEVICE;
  *bytes = s.memory;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetAttribute(int* value, CUdevice_attribute attribute, CUdevice device) {
  FAKE_ENTER("cuDeviceGetAttribute");
  if (device < 0 || device >= s.devices) return CUDA_ERROR_INVALID_DEVICE;
  switch (attribute) {
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: *value = 1; break;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: *value = s.fd_handles ? 1 : 0; break;
    default: *value = 0;
  }
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext* context, CUdevice device) {
  FAKE_ENTER("cuDevicePrimaryCtxRetain");
  if (device < 0 || device >= s.devices) return CUDA_ERROR_INVALID_DEVICE;
  *context = reinterpret_cast<CUcontext>(static_cast<uintptr_t>(device) + 1);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice device) {
  FAKE_ENTER("cuDevicePrimaryCtxRelease");
  return device >= 0 && device < s.devices ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

CUresult CUDAAPI cuCtxSetCurrent(CUcontext context) {
  FAKE_ENTER("cuCtxSetCurrent");
  current_device = static_cast<int>(reinterpret_cast<uintptr_t>(context)) - 1;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxSynchronize() {
  FAKE_ENTER("cuCtxSynchronize");
  return current_device >= 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

CUresult CUDAAPI cuMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  FAKE_ENTER("cuMemGetInfo");
  if (current_device < 0) return CUDA_ERROR_INVALID_CONTEXT;
  *total_bytes = s.memory;
  *free_bytes = s.memory - s.used[current_device];
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemGetAllocationGranularity(size_t* granularity, const CUmemAllocationProp* prop,
                                               CUmemAllocationGranularity_flags) {
  FAKE_ENTER("cuMemGetAllocationGranularity");
  if (prop == nullptr || prop->location.id < 0 || prop->location.id >= s.devices) return CUDA_ERROR_INVALID_VALUE;
  *granularity = kGranularity;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop,
                             unsigned long long) {
  FAKE_ENTER("cuMemCreate");
  if (prop == nullptr || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE || prop->location.id < 0 ||
      prop->location.id >= s.devices || size == 0 || size % kGranularity != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if ((prop->requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != 0 && !s.fd_handles) {
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  const int device = prop->location.id;
  if (s.used[device] + size > s.memory) return CUDA_ERROR_OUT_OF_MEMORY;
  int fd = NewMemfd(size);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  s.used[device] += size;
  *handle = s.next_handle++;
  s.handles[*handle] = Physical{fd, size, device, true};
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle) {
  FAKE_ENTER("cuMemRelease");
  auto it = s.handles.find(handle);
  if (it == s.handles.end()) return CUDA_ERROR_INVALID_VALUE;
  // Mappings keep the memfd's pages alive, as a real driver keeps mapped memory.
  close(it->second.fd);
  if (it->second.created) s.used[it->second.device] -= it->second.size;
  s.handles.erase(it);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemExportToShareableHandle(void* shareable, CUmemGenericAllocationHandle handle,
                                              CUmemAllocationHandleType type, unsigned long long) {
  FAKE_ENTER("cuMemExportToShareableHandle");
  auto it = s.handles.find(handle);
  if (it == s.handles.end() || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_INVALID_VALUE;
  if (!s.fd_handles) return CUDA_ERROR_NOT_SUPPORTED;
  int fd = fcntl(it->second.fd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  *static_cast<int*>(shareable) = fd;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle, void* os_handle,
                                                CUmemAllocationHandleType type) {
  FAKE_ENTER("cuMemImportFromShareableHandle");
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_INVALID_VALUE;
  const int given = static_cast<int>(reinterpret_cast<uintptr_t>(os_handle));
  struct stat st {};
  if (fstat(given, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size == 0) return CUDA_ERROR_INVALID_HANDLE;
  int fd = fcntl(given, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  *handle = s.next_handle++;
  s.handles[*handle] = Physical{fd, static_cast<uint64_t>(st.st_size), current_device < 0 ? 0 : current_device, false};
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr, unsigned long long) {
  FAKE_ENTER("cuMemAddressReserve");
  if (size == 0 || size % kGranularity != 0) return CUDA_ERROR_INVALID_VALUE;
  uintptr_t base = 0;
  if (!Reserve(size, alignment, &base)) return CUDA_ERROR_OUT_OF_MEMORY;
  s.reservations[base] = size;
  *ptr = base;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  FAKE_ENTER("cuMemAddressFree");
  auto it = s.reservations.find(ptr);
  if (it == s.reservations.end() || it->second != size) return CUDA_ERROR_INVALID_VALUE;
  if (s.mappings.count(ptr) != 0) return CUDA_ERROR_INVALID_VALUE;  // unmap first, as the driver asks
  munmap(reinterpret_cast<void*>(ptr), size);
  s.reservations.erase(it);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                          unsigned long long) {
  FAKE_ENTER("cuMemMap");
  auto physical = s.handles.find(handle);
  if (physical == s.handles.end()) return CUDA_ERROR_INVALID_HANDLE;
  auto reservation = s.reservations.upper_bound(ptr);
  if (reservation == s.reservations.begin()) return CUDA_ERROR_INVALID_VALUE;
  --reservation;
  if (ptr + size > reservation->first + reservation->second || size % kGranularity != 0 ||
      offset + size > physical->second.size) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  // Mapped without access: touching it before cuMemSetAccess is an error, as on a GPU.
  void* at = mmap(reinterpret_cast<void*>(ptr), size, PROT_NONE, MAP_SHARED | MAP_FIXED, physical->second.fd,
                  static_cast<off_t>(offset));
  if (at == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  s.mappings[ptr] = Mapping{size, false, false, false};
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size) {
  FAKE_ENTER("cuMemUnmap");
  auto it = s.mappings.find(ptr);
  if (it == s.mappings.end() || it->second.size != size || it->second.legacy) return CUDA_ERROR_INVALID_VALUE;
  mmap(reinterpret_cast<void*>(ptr), size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
  s.mappings.erase(it);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count) {
  FAKE_ENTER("cuMemSetAccess");
  auto it = s.mappings.find(ptr);
  if (it == s.mappings.end() || it->second.size != size || count != 1 || desc == nullptr ||
      desc->location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const bool writable = desc->flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (!writable && desc->flags != CU_MEM_ACCESS_FLAGS_PROT_READ) return CUDA_ERROR_INVALID_VALUE;
  if (!writable && !s.read_only) return CUDA_ERROR_NOT_SUPPORTED;
  if (mprotect(reinterpret_cast<void*>(ptr), size, writable ? PROT_READ | PROT_WRITE : PROT_READ) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  it->second.accessible = true;
  it->second.writable = writable;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemAlloc(CUdeviceptr* ptr, size_t bytes) {
  FAKE_ENTER("cuMemAlloc");
  if (current_device < 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  const uint64_t rounded = (bytes + kGranularity - 1) / kGranularity * kGranularity;
  if (s.used[current_device] + rounded > s.memory) return CUDA_ERROR_OUT_OF_MEMORY;
  int fd = NewMemfd(rounded);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  void* at = mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (at == MAP_FAILED) {
    close(fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  s.used[current_device] += rounded;
  *ptr = reinterpret_cast<uintptr_t>(at);
  s.mappings[*ptr] = Mapping{rounded, true, true, true};
  s.legacy_fds[*ptr] = fd;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemFree(CUdeviceptr ptr) {
  FAKE_ENTER("cuMemFree");
  auto fd = s.legacy_fds.find(ptr);
  if (fd == s.legacy_fds.end()) return CUDA_ERROR_INVALID_VALUE;
  const uint64_t size = s.mappings[ptr].size;
  munmap(reinterpret_cast<void*>(ptr), size);
  close(fd->second);
  s.legacy_fds.erase(fd);
  s.mappings.erase(ptr);
  if (current_device >= 0) s.used[current_device] -= size;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuIpcGetMemHandle(CUipcMemHandle* handle, CUdeviceptr ptr) {
  FAKE_ENTER("cuIpcGetMemHandle");
  auto fd = s.legacy_fds.find(ptr);
  if (fd == s.legacy_fds.end()) return CUDA_ERROR_INVALID_VALUE;
  IpcHandle named{kIpcMagic, static_cast<int32_t>(getpid()), fd->second, current_device, s.mappings[ptr].size};
  std::memset(handle, 0, sizeof *handle);
  std::memcpy(handle->reserved, &named, sizeof named);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuIpcOpenMemHandle(CUdeviceptr* ptr, CUipcMemHandle handle, unsigned int) {
  FAKE_ENTER("cuIpcOpenMemHandle");
  IpcHandle named;
  std::memcpy(&named, handle.reserved, sizeof named);
  if (named.magic != kIpcMagic) return CUDA_ERROR_INVALID_VALUE;
  if (named.pid == getpid()) return CUDA_ERROR_INVALID_CONTEXT;  // as the driver: not in the exporter
  auto opened = s.ipc_opened.find({named.pid, named.fd});
  if (opened != s.ipc_opened.end()) {
    opened->second.second++;
    *ptr = opened->second.first;
    return CUDA_SUCCESS;
  }
  const std::string path = "/proc/" + std::to_string(named.pid) + "/fd/" + std::to_string(named.fd);
  int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return CUDA_ERROR_INVALID_HANDLE;  // the exporter freed it or died
  void* at = mmap(nullptr, named.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (at == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  *ptr = reinterpret_cast<uintptr_t>(at);
  s.mappings[*ptr] = Mapping{named.size, true, true, true};
  s.ipc_opened[{named.pid, named.fd}] = {*ptr, 1};
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuIpcCloseMemHandle(CUdeviceptr ptr) {
  FAKE_ENTER("cuIpcCloseMemHandle");
  auto it = s.mappings.find(ptr);
  if (it == s.mappings.end() || !it->second.legacy || s.legacy_fds.count(ptr) != 0) return CUDA_ERROR_INVALID_VALUE;
  for (auto opened = s.ipc_opened.begin(); opened != s.ipc_opened.end(); ++opened) {
    if (opened->second.first != ptr) continue;
    if (--opened->second.second > 0) return CUDA_SUCCESS;  // still open elsewhere in this process
    s.ipc_opened.erase(opened);
    break;
  }
  munmap(reinterpret_cast<void*>(ptr), it->second.size);
  s.mappings.erase(it);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemHostAlloc(void** pointer, size_t bytes, unsigned int) {
  FAKE_ENTER("cuMemHostAlloc");
  if (bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  void* at = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (at == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  s.host[at] = bytes;
  *pointer = at;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemFreeHost(void* pointer) {
  FAKE_ENTER("cuMemFreeHost");
  auto it = s.host.find(pointer);
  if (it == s.host.end()) return CUDA_ERROR_INVALID_VALUE;
  munmap(pointer, it->second);
  s.host.erase(it);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemcpyHtoD(CUdeviceptr destination, const void* source, size_t bytes) {
  FAKE_ENTER("cuMemcpyHtoD");
  Mapping* mapping = Find(s, destination, bytes);
  if (mapping == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!mapping->writable) return CUDA_ERROR_ILLEGAL_ADDRESS;
  std::memcpy(reinterpret_cast<void*>(destination), source, bytes);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemcpyHtoDAsync(CUdeviceptr destination, const void* source, size_t bytes, CUstream) {
  FAKE_ENTER("cuMemcpyHtoDAsync");
  Mapping* mapping = Find(s, destination, bytes);
  if (mapping == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!mapping->writable) return CUDA_ERROR_ILLEGAL_ADDRESS;
  std::memcpy(reinterpret_cast<void*>(destination), source, bytes);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemcpyDtoH(void* destination, CUdeviceptr source, size_t bytes) {
  FAKE_ENTER("cuMemcpyDtoH");
  if (Find(s, source, bytes) == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::memcpy(destination, reinterpret_cast<const void*>(source), bytes);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemcpyDtoHAsync(void* destination, CUdeviceptr source, size_t bytes, CUstream) {
  FAKE_ENTER("cuMemcpyDtoHAsync");
  if (Find(s, source, bytes) == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::memcpy(destination, reinterpret_cast<const void*>(source), bytes);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemsetD8Async(CUdeviceptr destination, unsigned char value, size_t bytes, CUstream) {
  FAKE_ENTER("cuMemsetD8Async");
  Mapping* mapping = Find(s, destination, bytes);
  if (mapping == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!mapping->writable) return CUDA_ERROR_ILLEGAL_ADDRESS;
  std::memset(reinterpret_cast<void*>(destination), value, bytes);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemsetD8(CUdeviceptr destination, unsigned char value, size_t bytes) {
  FAKE_ENTER("cuMemsetD8");
  Mapping* mapping = Find(s, destination, bytes);
  if (mapping == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!mapping->writable) return CUDA_ERROR_ILLEGAL_ADDRESS;
  std::memset(reinterpret_cast<void*>(destination), value, bytes);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemHostRegister(void* pointer, size_t bytes, unsigned int) {
  FAKE_ENTER("cuMemHostRegister");
  if (pointer == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;  // host memory is what the double copies from anyway
}

CUresult CUDAAPI cuMemHostUnregister(void* pointer) {
  FAKE_ENTER("cuMemHostUnregister");
  return pointer != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuStreamCreate(CUstream* stream, unsigned int) {
  FAKE_ENTER("cuStreamCreate");
  *stream = reinterpret_cast<CUstream>(new int(0));
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamDestroy(CUstream stream) {
  FAKE_ENTER("cuStreamDestroy");
  delete reinterpret_cast<int*>(stream);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamSynchronize(CUstream) {
  FAKE_ENTER("cuStreamSynchronize");
  return CUDA_SUCCESS;
}

}  // extern "C"
