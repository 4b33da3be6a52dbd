// What the core asks the shell to do, in order. The shell carries each out and reports what comes
// of it as later events; nothing here returns a result to the core.
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "common/status.h"
#include "common/logging.h"
#include "ipc/warmpool.pb.h"
#include "supervisor/core/kept.h"

namespace warmpool::supervisor {

namespace action {

// One frame for a worker's channel (already serialised: the core keeps what it needs for a
// retry and hands the bytes over), with handles that travel with its first byte.
struct SendToWorker {
  uint32_t slot = 0;
  std::string frame;
  std::vector<int> handles;
  // The frame starts job `job`, which allocates this many bytes of device memory on the worker
  // (a load, an unpark, a park's host copy).
  uint64_t allocates = 0;
  uint64_t job = 0;
  // A load's model file (the registered, resolved path): the shell opens it beneath its model root
  // and sends it as the frame's first descriptor. When it cannot (a part of the path is a symlink
  // now, the file is gone), the frame is not sent and the job ends with that error, as if the
  // worker had answered it: the open is the load's first step.
  std::string model_file;
  // A kept region (action::CloseHandle::keep) the job is to reuse, sent to the worker ahead of the
  // frame (WorkerOffer); -1: none. The core no longer counts it as kept (core/kept_memory.h).
  int offer = -1;
};
// Whether an allocating frame says what it allocates: it starts job `job`, and an unpark
// allocates exactly the copy's bytes, a load at most what was admitted. What the simulator and
// the core's tests check on every frame (core/invariants.cc): a wrong size makes the shell offer
// kept memory of the wrong size, which the job then cannot use.
Status CheckAllocation(const SendToWorker& send);
// A reply to a client. Replies to a session that is gone are dropped by the shell.
struct Reply {
  uint64_t session = 0;
  v1::Envelope envelope;
};
// Start the worker process of a slot (fork+exec) as this generation; event::WorkerSpawned, then
// event::WorkerUp at its hello (or event::WorkerDown when it could not start).
struct SpawnWorker {
  uint32_t slot = 0;
  uint32_t generation = 0;
};
// SIGKILL the worker; its death comes back as event::WorkerDown carrying `reason`.
struct KillWorker {
  uint32_t slot = 0;
  std::string reason;
};
// The core no longer needs this handle (a weights region or a parked copy).
struct CloseHandle {
  int handle = -1;
  // Memory that no worker maps any more, which the core now counts as kept (core/kept_memory.h):
  // the shell keeps it, out of the descriptor store, until an offer (SendToWorker::offer) or a
  // DropKept. Anything else is only closed.
  bool keep = false;
};
// A kept region goes: closed, and named to the workers, which may keep a mapping of it.
struct DropKept {
  int handle = -1;
};
// Look at a model's file again (after a failed model's cooldown); answered by
// event::ModelInspected.
struct InspectModel {
  uint32_t model = 0;
  std::string name;
  std::string engine;
  std::string path;
};
// For the service manager (sd_notify).
struct Notify {
  enum class Kind { kReady, kReloading, kStopping, kStatus };
  Kind kind = Kind::kStatus;
  std::string status;
};
struct Log {
  LogLevel level = LogLevel::kInfo;
  std::string text;
};
// SIGTERM: no new connections.
struct StopAccepting {};
// The drain is over: every session is closed (after what was answered is flushed).
struct CloseSessions {};
// Stop every worker: close their channels, TERM, KILL after kill_after_ms; then
// event::WorkersStopped. No worker is started after this.
struct StopWorkers {
  uint64_t kill_after_ms = 0;
};

// What is worth keeping across a restart, least recently used first (Core::Kept): the shell makes
// the service manager's descriptor store hold exactly this (supervisor/warm_store.h). Sent after
// the start, when it changed (kKeptSyncMs, kKeptOrderOnlyMs) and at the end of a stop.
struct StoreKept {
  std::vector<KeptWeights> kept;
};

}  // namespace action

using Action = std::variant<action::SendToWorker, action::Reply, action::SpawnWorker, action::KillWorker,
                            action::CloseHandle, action::DropKept, action::InspectModel, action::Notify, action::Log,
                            action::StopAccepting, action::CloseSessions, action::StopWorkers, action::StoreKept>;

}  // namespace warmpool::supervisor
