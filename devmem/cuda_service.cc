#include "devmem/cuda_service.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <optional>

#include <spdlog/spdlog.h>

namespace warmpool {

namespace {

wp_status WpCode(const Status& status) {
  switch (status.code()) {
    case Code::kResourceExhausted: return WP_RESOURCE_EXHAUSTED;
    case Code::kInvalidArgument: return WP_INVALID_ARGUMENT;
    case Code::kUnavailable: return WP_UNAVAILABLE;
    default: return WP_INTERNAL;
  }
}

// Copies of at least this many bytes are chunked over streams; a chunk is this large.
constexpr uint64_t kChunkedCopyMin = 32ull << 20;
constexpr uint64_t kCopyChunk = 16ull << 20;
constexpr size_t kCopyStreams = 4;

}  // namespace

CudaMemory::~CudaMemory() {
  if (streams_.empty()) return;
  device_.MakeCurrent();
  for (CUstream stream : streams_) device_.driver().cuStreamDestroy(stream);
}

Status CudaMemory::CopyToDevice(const wp_region& region, uint64_t offset, const void* source, uint64_t bytes) {
  if (offset > region.bytes || bytes > region.bytes - offset) {
    return Error(Code::kInvalidArgument, "a copy of {} bytes at {} does not fit a region of {}", bytes, offset,
                 region.bytes);
  }
  if (bytes == 0) return OkStatus();
  const CudaDriver& cu = device_.driver();
  if (Status s = device_.MakeCurrent(); !s.ok()) return s;
  const CUdeviceptr destination = reinterpret_cast<CUdeviceptr>(region.ptr) + offset;
  if (bytes < kChunkedCopyMin) {
    // On this thread's default stream, and waited for: from pageable memory a copy may return once
    // the bytes are staged, and weights reported loaded must be in device memory for every process
    // that maps them.
    if (Status s = cu.Check(cu.cuMemcpyHtoDAsync(destination, source, bytes, CU_STREAM_PER_THREAD),
                            "cuMemcpyHtoDAsync");
        !s.ok()) {
      return s;
    }
    return cu.Check(cu.cuStreamSynchronize(CU_STREAM_PER_THREAD), "cuStreamSynchronize");
  }

  std::lock_guard lock(streams_mutex_);
  while (streams_.size() < kCopyStreams) {
    CUstream stream = nullptr;
    if (Status s = cu.Check(cu.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate"); !s.ok()) return s;
    streams_.push_back(stream);
  }
  // Pinned for the copy: from pageable memory the driver stages every byte through its own
  // buffer, one copy at a time. Registration can be refused (a sandbox, a range already
  // registered): the chunks then still overlap, only slower.
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(source) / page * page;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(source) + bytes + page - 1) / page * page;
  void* pinned = reinterpret_cast<void*>(begin);
  const bool registered = cu.cuMemHostRegister(pinned, end - begin, 0) == CUDA_SUCCESS;
  Status status;
  size_t next = 0;
  for (uint64_t done = 0; done < bytes && status.ok(); done += kCopyChunk) {
    const uint64_t n = std::min(kCopyChunk, bytes - done);
    status = cu.Check(cu.cuMemcpyHtoDAsync(destination + done, static_cast<const uint8_t*>(source) + done, n,
                                           streams_[next++ % streams_.size()]),
                      "cuMemcpyHtoDAsync");
  }
  // Every stream is waited for, even after a failure: the host range must not be unregistered
  // (or unmapped by the caller) while a copy may still read it.
  for (CUstream stream : streams_) {
    Status synced = cu.Check(cu.cuStreamSynchronize(stream), "cuStreamSynchronize");
    if (status.ok()) status = synced;
  }
  if (registered) cu.cuMemHostUnregister(pinned);
  return status;
}

CudaMemory::CudaMemory(CudaDevice device, CudaSharing sharing, Allocator allocate, Releaser release)
    : device_(std::move(device)), sharing_(sharing), allocate_(std::move(allocate)), release_(std::move(release)) {}

Result<std::unique_ptr<CudaMemory>> CudaMemory::Open(int device, CudaSharing sharing, Allocator allocate,
                                                     Releaser release) {
  Result<CudaDevice> opened = CudaDevice::Open(device);
  if (!opened.ok()) return opened.status();
  return std::unique_ptr<CudaMemory>(
      new CudaMemory(std::move(*opened), sharing, std::move(allocate), std::move(release)));
}

size_t CudaMemory::regions() const {
  std::lock_guard lock(mutex_);
  return regions_.size();
}

uint64_t CudaMemory::GrantOf(const wp_region& region) const {
  std::lock_guard lock(mutex_);
  auto it = regions_.find(reinterpret_cast<CUdeviceptr>(region.ptr));
  return it == regions_.end() ? 0 : it->second.grant;
}

Result<wp_region> CudaMemory::Map(int fd, uint64_t bytes, DeviceAccess access, uint64_t grant) {
  if (Status s = device_.MakeCurrent(); !s.ok()) return s;
  Region region;
  CUdeviceptr ptr = 0;
  if (sharing_ == CudaSharing::kVmm) {
    Result<DeviceMapping> mapping = DeviceMapping::Import(device_, fd, bytes, access);
    if (!mapping.ok()) return mapping.status();
    ptr = mapping->ptr();
    region.mapping.emplace<DeviceMapping>(std::move(*mapping));
  } else {
    Result<std::string> handle = LegacyHandleFromFd(fd);
    if (!handle.ok()) return handle.status();
    Result<LegacyMapping> mapping = LegacyMapping::Open(device_, *handle, bytes);
    if (!mapping.ok()) return mapping.status();
    ptr = mapping->ptr();
    region.mapping.emplace<LegacyMapping>(std::move(*mapping));
  }
  region.fd = fd;
  region.grant = grant;
  std::lock_guard lock(mutex_);
  auto [it, fresh] = regions_.try_emplace(ptr, std::move(region));
  if (!fresh) {
    // A legacy handle opened again: the same pointer, counted by the driver (the second open's
    // mapping object, released with `region` here, closes its own count). One descriptor serves.
    it->second.refs++;
    close(fd);
    return wp_region{reinterpret_cast<void*>(ptr), bytes, it->second.fd};
  }
  return wp_region{reinterpret_cast<void*>(ptr), bytes, fd};
}

void CudaMemory::Free(wp_region& region) {
  std::optional<Region> gone;
  {
    std::lock_guard lock(mutex_);
    auto it = regions_.find(reinterpret_cast<CUdeviceptr>(region.ptr));
    if (it != regions_.end() && it->second.refs > 1) {
      it->second.refs--;
      region = wp_region{nullptr, 0, -1};
      return;
    }
    if (it != regions_.end()) {
      gone.emplace(std::move(it->second));
      regions_.erase(it);
    }
  }
  region = wp_region{nullptr, 0, -1};
  if (!gone) return;
  if (Status s = device_.MakeCurrent(); !s.ok()) spdlog::warn("freeing device memory: {}", s.ToString());
  const uint64_t grant = gone->grant;
  close(gone->fd);
  gone.reset();  // unmaps
  if (grant != 0) release_(grant);
}

wp_status CudaMemory::CAlloc(void* ctx, uint64_t bytes, wp_region* out) {
  auto* self = static_cast<CudaMemory*>(ctx);
  if (bytes == 0) return WP_INVALID_ARGUMENT;
  Result<OwnerGrant> grant = self->allocate_(bytes);
  if (!grant.ok()) return WpCode(grant.status());
  Result<wp_region> region = self->Map(grant->fd, bytes, DeviceAccess::kReadWrite, grant->id);
  if (!region.ok()) {
    spdlog::error("cannot map {} granted bytes of device memory: {}", bytes, region.status().ToString());
    close(grant->fd);
    self->release_(grant->id);
    return WpCode(region.status());
  }
  // Zero-filled, as the ABI promises (fresh device memory holds whatever was there before).
  const CudaDriver& cu = self->device_.driver();
  // On this thread's own default stream (not the legacy one, which would serialise it with every
  // other thread's copies), and finished before anything is copied in by the copy streams.
  if (cu.cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(region->ptr), 0, bytes, CU_STREAM_PER_THREAD) !=
          CUDA_SUCCESS ||
      cu.cuStreamSynchronize(CU_STREAM_PER_THREAD) != CUDA_SUCCESS) {
    self->Free(*region);
    return WP_INTERNAL;
  }
  *out = *region;
  return WP_OK;
}

void CudaMemory::CFree(void* ctx, wp_region* region) {
  if (region != nullptr) static_cast<CudaMemory*>(ctx)->Free(*region);
}

wp_status CudaMemory::CImport(void* ctx, int handle, uint64_t bytes, wp_region* out) {
  auto* self = static_cast<CudaMemory*>(ctx);
  if (bytes == 0) return WP_INVALID_ARGUMENT;
  int own = fcntl(handle, F_DUPFD_CLOEXEC, 0);
  if (own < 0) return WP_INTERNAL;
  Result<wp_region> region = self->Map(own, bytes, DeviceAccess::kReadOnly, 0);
  if (!region.ok()) {
    spdlog::error("cannot map a shared region (weights, a KV cache): {}", region.status().ToString());
    close(own);
    return WpCode(region.status());
  }
  *out = *region;
  return WP_OK;
}

wp_status CudaMemory::CWrite(void* ctx, const wp_region* region, uint64_t offset, const void* source,
                             uint64_t bytes) {
  if (region == nullptr) return WP_INVALID_ARGUMENT;
  Status s = static_cast<CudaMemory*>(ctx)->CopyToDevice(*region, offset, source, bytes);
  if (!s.ok()) spdlog::error("copy into device memory: {}", s.ToString());
  return s.ok() ? WP_OK : WpCode(s);
}

wp_status CudaMemory::CRead(void* ctx, const wp_region* region, uint64_t offset, void* destination,
                            uint64_t bytes) {
  auto* self = static_cast<CudaMemory*>(ctx);
  if (region == nullptr || offset > region->bytes || bytes > region->bytes - offset) return WP_INVALID_ARGUMENT;
  if (bytes == 0) return WP_OK;
  const CudaDriver& cu = self->device_.driver();
  self->device_.MakeCurrent();
  // On this thread's default stream: an inference's reads do not queue behind a load's copies.
  CUresult r = cu.cuMemcpyDtoHAsync(destination, reinterpret_cast<CUdeviceptr>(region->ptr) + offset, bytes,
                                    CU_STREAM_PER_THREAD);
  if (r == CUDA_SUCCESS) r = cu.cuStreamSynchronize(CU_STREAM_PER_THREAD);
  return r == CUDA_SUCCESS ? WP_OK : WpCode(cu.Check(r, "cuMemcpyDtoHAsync"));
}

}  // namespace warmpool
