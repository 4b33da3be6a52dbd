#include "devmem/cuda_memory.h"

#include <unistd.h>

#include <cstring>
#include <utility>

namespace warmpool {

namespace {

CUmemAllocationProp AllocationProp(int ordinal) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = ordinal;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

}  // namespace

// ---- CudaDevice ----

Result<CudaDevice> CudaDevice::Open(int ordinal) {
  Result<const CudaDriver*> driver = CudaDriver::Get();
  if (!driver.ok()) return driver.status();
  const CudaDriver& cu = **driver;
  int count = 0;
  if (Status s = cu.Check(cu.cuDeviceGetCount(&count), "cuDeviceGetCount"); !s.ok()) return s;
  if (ordinal < 0 || ordinal >= count) {
    return Error(Code::kInvalidArgument, "CUDA device {} does not exist: this machine has {}", ordinal, count);
  }
  CudaDevice device;
  device.driver_ = &cu;
  device.ordinal_ = ordinal;
  if (Status s = cu.Check(cu.cuDeviceGet(&device.device_, ordinal), "cuDeviceGet"); !s.ok()) return s;
  if (Status s = cu.Check(cu.cuDevicePrimaryCtxRetain(&device.context_, device.device_),
                          "cuDevicePrimaryCtxRetain");
      !s.ok()) {
    device.context_ = nullptr;
    return s;
  }
  if (Status s = device.MakeCurrent(); !s.ok()) return s;
  int value = 0;
  if (cu.cuDeviceGetAttribute(&value, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                              device.device_) == CUDA_SUCCESS) {
    device.fd_handles_ = value != 0;
  }
  size_t granularity = 0;
  CUmemAllocationProp prop = AllocationProp(ordinal);
  if (device.fd_handles_ &&
      cu.cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) ==
          CUDA_SUCCESS &&
      granularity != 0) {
    device.granularity_ = granularity;
  } else {
    device.fd_handles_ = false;
    device.granularity_ = 2u << 20;  // what legacy allocations are rounded to for accounting
  }
  return device;
}

CudaDevice::CudaDevice(CudaDevice&& other) noexcept
    : driver_(other.driver_),
      ordinal_(other.ordinal_),
      device_(other.device_),
      context_(std::exchange(other.context_, nullptr)),
      granularity_(other.granularity_),
      fd_handles_(other.fd_handles_) {}

CudaDevice::~CudaDevice() {
  if (context_ != nullptr) driver_->cuDevicePrimaryCtxRelease(device_);
}

Status CudaDevice::MakeCurrent() const {
  return driver_->Check(driver_->cuCtxSetCurrent(context_), "cuCtxSetCurrent");
}

Result<CudaDeviceInfo> CudaDevice::Info() const {
  CudaDeviceInfo info;
  info.ordinal = ordinal_;
  char name[256] = {};
  if (Status s = driver_->Check(driver_->cuDeviceGetName(name, sizeof name - 1, device_), "cuDeviceGetName");
      !s.ok()) {
    return s;
  }
  info.name = name;
  size_t free_bytes = 0, total_bytes = 0;
  if (Status s = driver_->Check(driver_->cuMemGetInfo(&free_bytes, &total_bytes), "cuMemGetInfo"); !s.ok()) {
    return s;
  }
  info.free_bytes = free_bytes;
  info.total_bytes = total_bytes;
  int vmm = 0;
  driver_->cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, device_);
  info.vmm = vmm != 0;
  info.fd_handles = fd_handles_;
  info.granularity = granularity_;
  return info;
}

// ---- DeviceAllocation ----

Result<DeviceAllocation> DeviceAllocation::Create(const CudaDevice& device, uint64_t bytes) {
  if (bytes == 0) return Error(Code::kInvalidArgument, "cannot allocate 0 bytes of device memory");
  if (!device.fd_handles()) {
    return Error(Code::kFailedPrecondition,
                 "CUDA device {} cannot export memory as file descriptors: use [cuda] sharing = \"legacy\"",
                 device.ordinal());
  }
  const uint64_t rounded = device.RoundUp(bytes);
  CUmemAllocationProp prop = AllocationProp(device.ordinal());
  CUmemGenericAllocationHandle handle = 0;
  const CudaDriver& cu = device.driver();
  if (Status s = cu.Check(cu.cuMemCreate(&handle, rounded, &prop, 0), "cuMemCreate"); !s.ok()) {
    return Status(s.code(), fmt::format("cannot allocate {} bytes on CUDA device {}: {}", rounded,
                                        device.ordinal(), s.message()));
  }
  return DeviceAllocation(device, handle, rounded);
}

DeviceAllocation::DeviceAllocation(DeviceAllocation&& other) noexcept
    : driver_(other.driver_), handle_(std::exchange(other.handle_, 0)), bytes_(std::exchange(other.bytes_, 0)) {}

DeviceAllocation::~DeviceAllocation() {
  if (handle_ != 0) driver_->cuMemRelease(handle_);
}

Result<int> DeviceAllocation::Export() const {
  int fd = -1;
  if (Status s = driver_->Check(
          driver_->cuMemExportToShareableHandle(&fd, handle_, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
          "cuMemExportToShareableHandle");
      !s.ok()) {
    return s;
  }
  return fd;
}

// ---- DeviceMapping ----

Result<DeviceMapping> DeviceMapping::Import(const CudaDevice& device, int fd, uint64_t bytes,
                                            DeviceAccess access) {
  if (bytes == 0) return Error(Code::kInvalidArgument, "cannot map 0 bytes of device memory");
  const CudaDriver& cu = device.driver();
  DeviceMapping mapping;
  mapping.driver_ = &cu;
  mapping.bytes_ = bytes;
  // The descriptor is passed by value in the pointer argument, as the driver documents for
  // CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR.
  void* shareable = reinterpret_cast<void*>(static_cast<uintptr_t>(fd));
  if (Status s = cu.Check(cu.cuMemImportFromShareableHandle(&mapping.handle_, shareable,
                                                            CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                          "cuMemImportFromShareableHandle");
      !s.ok()) {
    return s;
  }
  mapping.reserved_ = device.RoundUp(bytes);
  if (Status s = cu.Check(cu.cuMemAddressReserve(&mapping.ptr_, mapping.reserved_, device.granularity(), 0, 0),
                          "cuMemAddressReserve");
      !s.ok()) {
    mapping.reserved_ = 0;
    return s;
  }
  // The whole reserved range is mapped: VMM maps whole granules, and the allocation is at least
  // that large because it was created with the same rounding.
  if (Status s = cu.Check(cu.cuMemMap(mapping.ptr_, mapping.reserved_, 0, mapping.handle_, 0), "cuMemMap");
      !s.ok()) {
    return Status(s.code(), fmt::format("cannot map {} bytes of shared device memory: {}", bytes, s.message()));
  }
  mapping.mapped_ = true;
  CUmemAccessDesc desc{};
  desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  desc.location.id = device.ordinal();
  desc.flags = access == DeviceAccess::kReadOnly ? CU_MEM_ACCESS_FLAGS_PROT_READ : CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CUresult r = cu.cuMemSetAccess(mapping.ptr_, mapping.reserved_, &desc, 1);
  if (r != CUDA_SUCCESS && access == DeviceAccess::kReadOnly) {
    // Not every driver offers read-only device mappings; a replica then maps read-write and is
    // trusted not to write (engines never write weights after load).
    desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    r = cu.cuMemSetAccess(mapping.ptr_, mapping.reserved_, &desc, 1);
  } else if (r == CUDA_SUCCESS) {
    mapping.read_only_ = access == DeviceAccess::kReadOnly;
  }
  if (Status s = cu.Check(r, "cuMemSetAccess"); !s.ok()) return s;
  return mapping;
}

DeviceMapping::DeviceMapping(DeviceMapping&& other) noexcept
    : driver_(other.driver_),
      handle_(std::exchange(other.handle_, 0)),
      ptr_(std::exchange(other.ptr_, 0)),
      reserved_(std::exchange(other.reserved_, 0)),
      bytes_(std::exchange(other.bytes_, 0)),
      mapped_(std::exchange(other.mapped_, false)),
      read_only_(other.read_only_) {}

DeviceMapping::~DeviceMapping() { Release(); }

void DeviceMapping::Release() {
  if (mapped_) driver_->cuMemUnmap(ptr_, reserved_);
  if (reserved_ != 0) driver_->cuMemAddressFree(ptr_, reserved_);
  if (handle_ != 0) driver_->cuMemRelease(handle_);
  mapped_ = false;
  reserved_ = 0;
  handle_ = 0;
  ptr_ = 0;
}

// ---- Legacy CUDA IPC ----

Result<LegacyAllocation> LegacyAllocation::Create(const CudaDevice& device, uint64_t bytes) {
  if (bytes == 0) return Error(Code::kInvalidArgument, "cannot allocate 0 bytes of device memory");
  const CudaDriver& cu = device.driver();
  LegacyAllocation allocation;
  allocation.driver_ = &cu;
  if (Status s = cu.Check(cu.cuMemAlloc(&allocation.ptr_, bytes), "cuMemAlloc"); !s.ok()) {
    return Status(s.code(), fmt::format("cannot allocate {} bytes on CUDA device {}: {}", bytes,
                                        device.ordinal(), s.message()));
  }
  allocation.bytes_ = bytes;
  return allocation;
}

LegacyAllocation::LegacyAllocation(LegacyAllocation&& other) noexcept
    : driver_(other.driver_), ptr_(std::exchange(other.ptr_, 0)), bytes_(std::exchange(other.bytes_, 0)) {}

LegacyAllocation::~LegacyAllocation() {
  if (ptr_ != 0) driver_->cuMemFree(ptr_);
}

Result<std::string> LegacyAllocation::Handle() const {
  CUipcMemHandle handle{};
  if (Status s = driver_->Check(driver_->cuIpcGetMemHandle(&handle, ptr_), "cuIpcGetMemHandle"); !s.ok()) {
    return s;
  }
  return std::string(handle.reserved, sizeof handle.reserved);
}

Result<LegacyMapping> LegacyMapping::Open(const CudaDevice& device, const std::string& handle, uint64_t bytes) {
  CUipcMemHandle ipc{};
  if (handle.size() != sizeof ipc.reserved) {
    return Error(Code::kInvalidArgument, "a CUDA IPC handle has {} bytes, not {}", sizeof ipc.reserved,
                 handle.size());
  }
  std::memcpy(ipc.reserved, handle.data(), handle.size());
  const CudaDriver& cu = device.driver();
  LegacyMapping mapping;
  mapping.driver_ = &cu;
  if (Status s = cu.Check(cu.cuIpcOpenMemHandle(&mapping.ptr_, ipc, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
                          "cuIpcOpenMemHandle");
      !s.ok()) {
    mapping.ptr_ = 0;
    return s;
  }
  mapping.bytes_ = bytes;
  return mapping;
}

LegacyMapping::LegacyMapping(LegacyMapping&& other) noexcept
    : driver_(other.driver_), ptr_(std::exchange(other.ptr_, 0)), bytes_(std::exchange(other.bytes_, 0)) {}

LegacyMapping::~LegacyMapping() {
  if (ptr_ != 0) driver_->cuIpcCloseMemHandle(ptr_);
}

}  // namespace warmpool
