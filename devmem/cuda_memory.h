// Device memory on one NVIDIA GPU, in the two shareable forms the cuda backend uses:
//
// - VMM (the driver's virtual memory management): a physical allocation made with cuMemCreate,
//   exportable as a POSIX file descriptor that travels with SCM_RIGHTS like a memfd. An importer
//   turns the descriptor into its own handle, reserves an address range, maps and sets access —
//   read-only for readers where the driver allows it.
// - Legacy CUDA IPC, for devices or drivers without descriptor export: cuMemAlloc memory named by
//   a 64-byte cuIpcGetMemHandle, opened once per importing process.
//
// Allocations are made by the device's owner process (owner/), never by a worker, so that a worker
// crash frees nothing; workers only import. Each class releases what it holds when destroyed.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "devmem/cuda_driver.h"

namespace warmpool {

struct CudaDeviceInfo {
  int ordinal = 0;
  std::string name;
  uint64_t total_bytes = 0;
  uint64_t free_bytes = 0;   // at the time of the call, from cuMemGetInfo
  uint64_t granularity = 0;  // VMM allocation granularity (sizes are rounded up to it)
  bool vmm = false;          // cuMemCreate and friends work
  bool fd_handles = false;   // VMM allocations export as POSIX file descriptors
};

// One device and its primary context, current on the thread that opened it.
class CudaDevice {
 public:
  static Result<CudaDevice> Open(int ordinal);
  CudaDevice(CudaDevice&& other) noexcept;
  CudaDevice& operator=(CudaDevice&& other) = delete;
  CudaDevice(const CudaDevice&) = delete;
  ~CudaDevice();

  // Makes the context current on the calling thread (each thread that calls the driver needs it).
  Status MakeCurrent() const;
  // Name, memory and capabilities; free_bytes as of now.
  Result<CudaDeviceInfo> Info() const;
  uint64_t RoundUp(uint64_t bytes) const { return (bytes + granularity_ - 1) / granularity_ * granularity_; }

  const CudaDriver& driver() const { return *driver_; }
  int ordinal() const { return ordinal_; }
  uint64_t granularity() const { return granularity_; }
  bool fd_handles() const { return fd_handles_; }

 private:
  CudaDevice() = default;
  const CudaDriver* driver_ = nullptr;
  int ordinal_ = 0;
  CUdevice device_ = 0;
  CUcontext context_ = nullptr;
  uint64_t granularity_ = 0;
  bool fd_handles_ = false;
};

// Owner side: a physical VMM allocation that can be exported as a descriptor.
class DeviceAllocation {
 public:
  // bytes (> 0) rounded up to the device's granularity. RESOURCE_EXHAUSTED when the device is full.
  static Result<DeviceAllocation> Create(const CudaDevice& device, uint64_t bytes);
  DeviceAllocation(DeviceAllocation&& other) noexcept;
  DeviceAllocation& operator=(DeviceAllocation&& other) = delete;
  DeviceAllocation(const DeviceAllocation&) = delete;
  ~DeviceAllocation();  // releases this process's handle; importers keep their own

  // A new descriptor for the allocation (the caller closes it).
  Result<int> Export() const;
  uint64_t bytes() const { return bytes_; }

 private:
  DeviceAllocation(const CudaDevice& device, CUmemGenericAllocationHandle handle, uint64_t bytes)
      : driver_(&device.driver()), handle_(handle), bytes_(bytes) {}
  const CudaDriver* driver_;
  CUmemGenericAllocationHandle handle_ = 0;
  uint64_t bytes_ = 0;
};

enum class DeviceAccess { kReadWrite, kReadOnly };

// Importer side: an exported allocation mapped into this process's device address space.
class DeviceMapping {
 public:
  // Imports fd (which stays the caller's), reserves bytes of address space, maps and sets access.
  // bytes must not exceed the allocation. A read-only request that the driver refuses is mapped
  // read-write instead; read_only() says which it got.
  static Result<DeviceMapping> Import(const CudaDevice& device, int fd, uint64_t bytes,
                                      DeviceAccess access);
  DeviceMapping(DeviceMapping&& other) noexcept;
  DeviceMapping& operator=(DeviceMapping&& other) = delete;
  DeviceMapping(const DeviceMapping&) = delete;
  ~DeviceMapping();

  CUdeviceptr ptr() const { return ptr_; }
  uint64_t bytes() const { return bytes_; }
  bool read_only() const { return read_only_; }

 private:
  DeviceMapping() = default;
  void Release();
  const CudaDriver* driver_ = nullptr;
  CUmemGenericAllocationHandle handle_ = 0;
  CUdeviceptr ptr_ = 0;
  uint64_t reserved_ = 0;  // the address range, rounded up to the granularity
  uint64_t bytes_ = 0;
  bool mapped_ = false;
  bool read_only_ = false;
};

// Legacy CUDA IPC: cuMemAlloc memory named by a 64-byte handle any process on the machine can open.
class LegacyAllocation {
 public:
  static Result<LegacyAllocation> Create(const CudaDevice& device, uint64_t bytes);
  LegacyAllocation(LegacyAllocation&& other) noexcept;
  LegacyAllocation& operator=(LegacyAllocation&& other) = delete;
  LegacyAllocation(const LegacyAllocation&) = delete;
  ~LegacyAllocation();

  // The handle's 64 bytes, as cuIpcGetMemHandle writes them.
  Result<std::string> Handle() const;
  uint64_t bytes() const { return bytes_; }
  CUdeviceptr ptr() const { return ptr_; }

 private:
  LegacyAllocation() = default;
  const CudaDriver* driver_ = nullptr;
  CUdeviceptr ptr_ = 0;
  uint64_t bytes_ = 0;
};

class LegacyMapping {
 public:
  // handle: the 64 bytes from LegacyAllocation::Handle. INVALID_ARGUMENT for any other size.
  static Result<LegacyMapping> Open(const CudaDevice& device, const std::string& handle, uint64_t bytes);
  LegacyMapping(LegacyMapping&& other) noexcept;
  LegacyMapping& operator=(LegacyMapping&& other) = delete;
  LegacyMapping(const LegacyMapping&) = delete;
  ~LegacyMapping();

  CUdeviceptr ptr() const { return ptr_; }
  uint64_t bytes() const { return bytes_; }

 private:
  LegacyMapping() = default;
  const CudaDriver* driver_ = nullptr;
  CUdeviceptr ptr_ = 0;
  uint64_t bytes_ = 0;
};

}  // namespace warmpool
