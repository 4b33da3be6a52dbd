// The cuda backend's allocation owners, one process per device (warmpool-owner, owner/owner.h):
// started with fork+exec like workers, channel on fd 3, death learnt from the kernel. The shell
// forwards grants of device memory through them (supervisor/grants.h); what an owner's death means
// for the models on its device is the core's business (event::DeviceLost).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <uv.h>

#include "ipc/connection.h"
#include "ipc/uv_handle.h"
#include "ipc/warmpool.pb.h"
#include "ipc/owner.pb.h"
#include "supervisor/child_process.h"

namespace warmpool::supervisor {

struct DeviceOwnersOptions {
  std::string owner_path;  // the warmpool-owner binary
  std::string sharing = "auto";
  std::vector<uint32_t> devices;
};

struct DeviceOwnerEvents {
  std::function<void(uint32_t device, const v1::OwnerHello& hello)> on_ready;
  // An allocation's answer; fd is its exported descriptor (vmm) or -1.
  std::function<void(uint32_t device, const v1::OwnerAllocated& allocated, int fd)> on_allocated;
  // The owner is gone: every allocation it held went with it. fatal: it exited with status 2
  // (no driver, no such device, a sharing mode the device lacks): starting it again cannot help.
  std::function<void(uint32_t device, const std::string& why, bool fatal)> on_death;
};

class DeviceOwners {
 public:
  DeviceOwners(uv_loop_t* loop, DeviceOwnersOptions options, DeviceOwnerEvents events);
  ~DeviceOwners();

  // Starts the owner of a device (again, after a death). False when it could not be started.
  bool Start(uint32_t device);
  // False when the device's owner is not running (the caller answers for it).
  bool Send(uint32_t device, const v1::OwnerEnvelope& message);
  bool running(uint32_t device) const;
  // Closes every channel: owners release everything and exit on EOF (one still there when this
  // object goes is SIGKILLed).
  void Shutdown();
  // For the fault-injection harness and tests: SIGKILL the owner.
  void Kill(uint32_t device);

 private:
  struct Owner;
  Owner* Find(uint32_t device);
  const Owner* Find(uint32_t device) const;
  void OnFrame(Owner& owner, std::string_view body);

  uv_loop_t* loop_;
  DeviceOwnersOptions options_;
  DeviceOwnerEvents events_;
  std::vector<std::unique_ptr<Owner>> owners_;
  bool shutting_down_ = false;
};

}  // namespace warmpool::supervisor
