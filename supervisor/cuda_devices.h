// The cuda backend behind the device seam (device_backend.h): one memory-owner process per device
// (supervisor/device_owners.h), and the grants of its memory to workers (supervisor/grants.h).
// Which devices serve, with what budget and how memory is shared is resolved at start from the
// probe (Configure); when an owner dies the core hears event::DeviceLost, and DeviceRestored
// when it is back. Its decisions (restart backoff, grant admission) are policy/device_owner.h's.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <uv.h>

#include "ipc/uv_handle.h"
#include "supervisor/config.h"
#include "supervisor/core/events.h"
#include "supervisor/device_backend.h"
#include "supervisor/device_owners.h"
#include "supervisor/device_probe.h"
#include "supervisor/grants.h"

namespace warmpool::supervisor {

class CudaDevices final : public DeviceBackend {
 public:
  // `dispatch` hands the core an event (DeviceLost, DeviceRestored).
  CudaDevices(uv_loop_t* loop, std::string owner_path, std::function<void(Event)> dispatch);
  ~CudaDevices() override;

  // The devices as probed, into config.devices (budgets: [pool] budget, or free less [cuda]
  // reserve), config.backend and config.cuda_sharing as resolved. `config` must outlive this.
  Status Configure(const BackendChoice& choice, Config& config);

  Status Start(WorkerPool* workers) override;
  void Shutdown() override;
  // Its grant released (memory a worker freed, or the core let go of). Nothing is kept on cuda:
  // the memory is the owner's, and the core never asks (so neither offers nor drops come).
  void Release(int fd, bool keep) override;
  void Offer(uint32_t, uint64_t, uint64_t, int) override {}
  void DropKept(int) override {}
  void HandedOver() override {}
  bool OnWorkerMessage(uint32_t slot, const v1::WorkerEnvelope& message) override;
  // The weights of a cuda load, and a GPU's KV cache, live in grants: released when the core lets
  // them go.
  void OnKept(uint32_t slot, uint64_t grant, int fd, const char* what) override;
  void OnWorkerGone(uint32_t slot, uint32_t generation) override;

 private:
  struct Owner {
    CudaDevices* devices = nullptr;
    uint32_t device = 0;
    ipc::UvHandle<uv_timer_t> restart_timer;
    uint64_t started_ms = 0;
    uint64_t restart_delay_ms = 0;
    bool fatal = false;  // exited with status 2: not started again
    std::vector<v1::OwnerEnvelope> waiting;  // allocations asked while it restarts
  };
  void OnAllocate(uint32_t slot, const v1::WorkerAllocate& request);
  void OnAllocated(uint32_t device, const v1::OwnerAllocated& allocated, int fd);
  void OnOwnerDeath(uint32_t device, const std::string& why, bool fatal);
  void ScheduleRestart(Owner& owner);
  void RestartOwner(uint32_t device);
  void ReleaseGrant(const GrantRelease& release);

  uv_loop_t* loop_;
  std::string owner_path_;
  std::function<void(Event)> dispatch_;
  Config* config_ = nullptr;
  std::string sharing_;
  std::vector<uint32_t> ordinals_;
  WorkerPool* workers_ = nullptr;
  std::unique_ptr<DeviceOwners> owners_;
  GrantTable grants_;
  std::vector<std::unique_ptr<Owner>> owner_states_;  // index = device = CUDA ordinal
};

}  // namespace warmpool::supervisor
