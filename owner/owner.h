// warmpool-owner: the allocation owner of one CUDA device. warmpoold starts one per device (fork+
// exec, channel on an inherited descriptor, like a worker). It creates, exports and releases the
// device memory that holds weights on the supervisor's word, and runs no engine code: a worker that
// crashes, hangs or is killed frees no weights, because it never owned any — it only mapped them.
//
// Whether a VMM allocation outlives its creator while only an exported descriptor is held elsewhere
// is not documented, so nothing depends on it: if this process dies, the supervisor treats every
// model on the device as not resident. (scripts/gpu-check.sh measures the question on a GPU.)
//
// One thread, one blocking channel: allocation is rare and quick next to the loads it serves.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>

#include "common/status.h"
#include "devmem/cuda_memory.h"
#include "ipc/blocking_channel.h"
#include "ipc/warmpool.pb.h"
#include "ipc/owner.pb.h"

namespace warmpool::owner {

enum class Sharing { kAuto, kVmm, kLegacy };
// "auto", "vmm" or "legacy"; INVALID_ARGUMENT otherwise.
Result<Sharing> ParseSharing(const std::string& text);

struct OwnerOptions {
  int channel_fd = 3;
  uint32_t device = 0;
  Sharing sharing = Sharing::kAuto;
  uint32_t max_frame_bytes = 1u << 20;
};

class DeviceOwner {
 public:
  explicit DeviceOwner(OwnerOptions options);
  // Opens the device, settles how memory is shared and says hello. An error is fatal
  // configuration (exit status 2): no device, no driver, or "vmm" asked of a device without it.
  Status Start();
  // Serves until the supervisor closes the channel; returns the exit status. Everything still
  // allocated is released on the way out.
  int Run();

  bool vmm() const { return vmm_; }

 private:
  void Allocate(const v1::OwnerAllocate& request);
  void Release(uint64_t id);

  OwnerOptions options_;
  ipc::BlockingChannel channel_;
  std::optional<CudaDevice> device_;
  bool vmm_ = true;
  std::unordered_map<uint64_t, DeviceAllocation> vmm_allocations_;
  std::unordered_map<uint64_t, LegacyAllocation> legacy_allocations_;
};

// The devices of this machine as JSON, for the supervisor's probe (warmpool-owner --probe):
// {"driver_version": 13000, "devices": [{"ordinal", "name", "total_bytes", "free_bytes",
// "granularity", "vmm", "fd_handles"}]}, or {"error": "..."} with a non-OK status.
Result<std::string> ProbeDevices();

}  // namespace warmpool::owner
