// The driver test double's calls on cuMemAlloc's memory, legacy IPC handles, host memory, copies
// and streams (fake_driver.cc says what the double is, and what it cannot show).
#include "tests/cuda_double/fake_driver_state.h"

using namespace warmpool::fake_cuda;

extern "C" {

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
