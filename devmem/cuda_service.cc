#include "devmem/cuda_service.h"

#include <fcntl.h>
#include <unistd.h>

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

}  // namespace

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
  regions_.emplace(ptr, std::move(region));
  return wp_region{reinterpret_cast<void*>(ptr), bytes, fd};
}

void CudaMemory::Free(wp_region& region) {
  std::optional<Region> gone;
  {
    std::lock_guard lock(mutex_);
    auto it = regions_.find(reinterpret_cast<CUdeviceptr>(region.ptr));
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
  if (cu.cuMemsetD8(reinterpret_cast<CUdeviceptr>(region->ptr), 0, bytes) != CUDA_SUCCESS) {
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
    spdlog::error("cannot map shared weights: {}", region.status().ToString());
    close(own);
    return WpCode(region.status());
  }
  *out = *region;
  return WP_OK;
}

wp_status CudaMemory::CWrite(void* ctx, const wp_region* region, uint64_t offset, const void* source,
                             uint64_t bytes) {
  auto* self = static_cast<CudaMemory*>(ctx);
  if (region == nullptr || offset > region->bytes || bytes > region->bytes - offset) return WP_INVALID_ARGUMENT;
  if (bytes == 0) return WP_OK;
  const CudaDriver& cu = self->device_.driver();
  self->device_.MakeCurrent();
  CUresult r = cu.cuMemcpyHtoD(reinterpret_cast<CUdeviceptr>(region->ptr) + offset, source, bytes);
  return r == CUDA_SUCCESS ? WP_OK : WpCode(cu.Check(r, "cuMemcpyHtoD"));
}

wp_status CudaMemory::CRead(void* ctx, const wp_region* region, uint64_t offset, void* destination,
                            uint64_t bytes) {
  auto* self = static_cast<CudaMemory*>(ctx);
  if (region == nullptr || offset > region->bytes || bytes > region->bytes - offset) return WP_INVALID_ARGUMENT;
  if (bytes == 0) return WP_OK;
  const CudaDriver& cu = self->device_.driver();
  self->device_.MakeCurrent();
  CUresult r = cu.cuMemcpyDtoH(destination, reinterpret_cast<CUdeviceptr>(region->ptr) + offset, bytes);
  return r == CUDA_SUCCESS ? WP_OK : WpCode(cu.Check(r, "cuMemcpyDtoH"));
}

}  // namespace warmpool
