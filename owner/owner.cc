#include "owner/owner.h"

#include <unistd.h>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "ipc/error_proto.h"
#include "ipc/exit_status.h"

namespace warmpool::owner {

Result<Sharing> ParseSharing(const std::string& text) {
  if (text == "auto") return Sharing::kAuto;
  if (text == "vmm") return Sharing::kVmm;
  if (text == "legacy") return Sharing::kLegacy;
  return Error(Code::kInvalidArgument, "[cuda] sharing must be auto, vmm or legacy, not \"{}\"", text);
}

DeviceOwner::DeviceOwner(OwnerOptions options)
    : options_(options), channel_(options.channel_fd, options.max_frame_bytes) {}

Status DeviceOwner::Start() {
  Result<CudaDevice> device = CudaDevice::Open(static_cast<int>(options_.device));
  if (!device.ok()) return device.status();
  device_.emplace(std::move(*device));
  Result<CudaDeviceInfo> info = device_->Info();
  if (!info.ok()) return info.status();
  switch (options_.sharing) {
    case Sharing::kAuto: vmm_ = info->fd_handles; break;
    case Sharing::kLegacy: vmm_ = false; break;
    case Sharing::kVmm:
      if (!info->fd_handles) {
        return Error(Code::kFailedPrecondition,
                     "CUDA device {} ({}) cannot export memory as file descriptors, which [cuda] "
                     "sharing = \"vmm\" needs: set sharing = \"auto\" or \"legacy\"",
                     options_.device, info->name);
      }
      vmm_ = true;
      break;
  }
  v1::OwnerEnvelope hello;
  v1::OwnerHello* h = hello.mutable_hello();
  h->set_device(options_.device);
  h->set_pid(getpid());
  h->set_name(info->name);
  h->set_total_bytes(info->total_bytes);
  h->set_free_bytes(info->free_bytes);
  h->set_granularity(info->granularity);
  h->set_sharing(vmm_ ? "vmm" : "legacy");
  return channel_.Write(hello);
}

int DeviceOwner::Run() {
  for (;;) {
    v1::OwnerEnvelope message;
    Status s = channel_.Read(message);
    if (!s.ok()) {
      if (s.code() == Code::kUnavailable) return ipc::kChildStopped;  // the supervisor closed the channel
      spdlog::error("owner of device {}: bad message from the supervisor: {}", options_.device, s.ToString());
      return ipc::kChildFailed;
    }
    switch (message.body_case()) {
      case v1::OwnerEnvelope::kAllocate: Allocate(message.allocate()); break;
      case v1::OwnerEnvelope::kRelease: Release(message.release().id()); break;
      default:
        spdlog::error("owner of device {}: unexpected message {} from the supervisor", options_.device,
                      static_cast<int>(message.body_case()));
        return ipc::kChildFailed;
    }
  }
}

void DeviceOwner::Allocate(const v1::OwnerAllocate& request) {
  v1::OwnerEnvelope reply;
  v1::OwnerAllocated* done = reply.mutable_allocated();
  done->set_id(request.id());
  int exported = -1;
  Status status;
  if (vmm_allocations_.count(request.id()) != 0 || legacy_allocations_.count(request.id()) != 0) {
    status = Error(Code::kInvalidArgument, "allocation {} exists already", request.id());
  } else if (vmm_) {
    Result<DeviceAllocation> allocation = DeviceAllocation::Create(*device_, request.bytes());
    Result<int> fd = allocation.ok() ? allocation->Export() : Result<int>(allocation.status());
    if (fd.ok()) {
      exported = *fd;
      done->set_bytes(allocation->bytes());
      vmm_allocations_.emplace(request.id(), std::move(*allocation));
    } else {
      status = fd.status();
    }
  } else {
    Result<LegacyAllocation> allocation = LegacyAllocation::Create(*device_, request.bytes());
    Result<std::string> handle = allocation.ok() ? allocation->Handle() : Result<std::string>(allocation.status());
    if (handle.ok()) {
      done->set_bytes(allocation->bytes());
      done->set_ipc_handle(*handle);
      legacy_allocations_.emplace(request.id(), std::move(*allocation));
    } else {
      status = handle.status();
    }
  }
  if (!status.ok()) ipc::SetError(done->mutable_error(), status);
  if (Status s = channel_.Write(reply, exported >= 0 ? std::vector<int>{exported} : std::vector<int>{});
      !s.ok()) {
    spdlog::debug("owner of device {}: reply dropped: {}", options_.device, s.ToString());
  }
  if (exported >= 0) close(exported);  // the supervisor got its own descriptor; the handle stays here
}

void DeviceOwner::Release(uint64_t id) {
  if (vmm_allocations_.erase(id) == 0 && legacy_allocations_.erase(id) == 0) {
    spdlog::warn("owner of device {}: release of allocation {}, which it does not hold", options_.device, id);
  }
}

Result<std::string> ProbeDevices() {
  Result<const CudaDriver*> driver = CudaDriver::Get();
  if (!driver.ok()) return driver.status();
  const CudaDriver& cu = **driver;
  int count = 0;
  if (Status s = cu.Check(cu.cuDeviceGetCount(&count), "cuDeviceGetCount"); !s.ok()) return s;
  nlohmann::json devices = nlohmann::json::array();
  for (int ordinal = 0; ordinal < count; ++ordinal) {
    Result<CudaDevice> device = CudaDevice::Open(ordinal);
    Result<CudaDeviceInfo> info = device.ok() ? device->Info() : Result<CudaDeviceInfo>(device.status());
    if (!info.ok()) {
      return Status(info.status().code(), fmt::format("CUDA device {}: {}", ordinal, info.status().message()));
    }
    devices.push_back({{"ordinal", info->ordinal},
                       {"name", info->name},
                       {"total_bytes", info->total_bytes},
                       {"free_bytes", info->free_bytes},
                       {"granularity", info->granularity},
                       {"vmm", info->vmm},
                       {"fd_handles", info->fd_handles}});
  }
  return nlohmann::json{{"driver_version", cu.version()}, {"devices", devices}}.dump();
}

}  // namespace warmpool::owner
