// The shell's one seam to device memory. Two backends stand behind it: host (memfd regions, and
// the memory freed between models kept for reuse: host_memory.h) and cuda (one memory-owner
// process per device and the grants of its memory to workers: cuda_devices.h). The daemon calls
// it at these points and never asks which backend serves; the core sees neither, only the
// weights' handles and event::DeviceLost / DeviceRestored.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <uv.h>

#include "common/status.h"
#include "ipc/warmpool.pb.h"
#include "ipc/worker.pb.h"
#include "supervisor/config.h"
#include "supervisor/core/events.h"

namespace warmpool::supervisor {

class WorkerPool;

class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;

  // Once the workers exist: starts what serves the devices (cuda: the owners).
  virtual Status Start(WorkerPool* workers) = 0;
  // The stop: nothing is started again.
  virtual void Shutdown() = 0;

  // action::CloseHandle: a handle the core let go of. `keep`: the core counts it as kept memory
  // (supervisor/core/kept_memory.h) until it offers or drops it.
  virtual void Release(int fd, bool keep) = 0;
  // action::SendToWorker::offer: the kept region `fd` goes to job `job` on worker `slot`, which
  // allocates `bytes`; sent ahead of the job's frame.
  virtual void Offer(uint32_t slot, uint64_t job, uint64_t bytes, int fd) = 0;
  // action::DropKept.
  virtual void DropKept(int fd) = 0;
  // A new daemon maps this memory from now on (a takeover): none of it is kept here any more.
  virtual void HandedOver() = 0;

  // A worker's message about device memory (allocate, free): true when it was one, and handled.
  virtual bool OnWorkerMessage(uint32_t slot, const v1::WorkerEnvelope& message) = 0;
  // A load's weights or its engine's KV cache (`what`) arrived from worker `slot` with descriptor
  // `fd` (the core's from now on), held in the device-memory grant the worker named (0: none).
  virtual void OnKept(uint32_t slot, uint64_t grant, int fd, const char* what) = 0;
  virtual void OnWorkerGone(uint32_t slot, uint32_t generation) = 0;
};

// The backend that serves, as config.backend asks (auto: cuda when a probe child finds a working
// GPU; this process never loads the CUDA driver itself), set up for config.devices. On host,
// `config` is made to say so: backend "host" and one device with the whole budget. Events (an
// owner's death, its return) go to `dispatch`.
Result<std::unique_ptr<DeviceBackend>> OpenDeviceBackend(Config& config, uv_loop_t* loop, const std::string& owner_path,
                                                         std::function<void(Event)> dispatch);

}  // namespace warmpool::supervisor
