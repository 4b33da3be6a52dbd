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
#include "tests/cuda_double/fake_driver_state.h"

#include <cstdlib>
#include <string>

namespace warmpool::fake_cuda {
namespace {

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

}  // namespace
}  // namespace warmpool::fake_cuda

using namespace warmpool::fake_cuda;

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

}  // extern "C"
