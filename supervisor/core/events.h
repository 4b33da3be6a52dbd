// What the core is told. The shell (supervisor/daemon.cc) turns libuv callbacks into these: a
// client's request or departure, a worker's hello, message or death, the passing of time, a
// reload, a stop. The simulator (sim/) makes the same events from a seed. Every event comes with
// the time it happened (Time): the core never reads a clock.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "common/status.h"
#include "ipc/warmpool.pb.h"
#include "ipc/worker.pb.h"
#include "supervisor/config.h"
#include "supervisor/core/model_entry.h"

namespace warmpool::supervisor {

struct Time {
  uint64_t mono_ms = 0;  // monotonic: timeouts, deadlines, cooldowns
  uint64_t unix_ns = 0;  // wall clock: values shown to users and sent to workers
};

namespace event {

// A request a client sent (already past the connection's own limits). `admin`: root, the
// daemon's user or a member of [access] admin_group. A register request of an admin comes with
// its file already looked at (`registration`), since looking is I/O.
struct ClientRequest {
  uint64_t session = 0;
  bool admin = false;
  uint32_t uid = 0;
  bool tcp = false;  // the HTTP API on loopback TCP: no uid; admin only with the admin token
  v1::Envelope envelope;
  std::optional<Result<ModelEntry>> registration;
  // A descriptor that came with the frame (a region's memfd), now the core's, and what the shell
  // found when it looked at it (a memfd sealed against shrinking, writable, large enough).
  int handle = -1;
  Status handle_check;
};
// The client's connection closed: nothing more can be sent to it.
struct ClientGone {
  uint64_t session = 0;
};
// The shell started a worker process as action::SpawnWorker asked (its hello comes later).
struct WorkerSpawned {
  uint32_t slot = 0;
  uint32_t generation = 0;
  int pid = 0;
};
// A worker said hello and takes jobs.
struct WorkerUp {
  uint32_t slot = 0;
  uint32_t generation = 0;
};
// A message from a worker, with the handles (descriptors) that came with it: the weights region of
// a load, the host copy of a park.
struct WorkerMessage {
  uint32_t slot = 0;
  v1::WorkerEnvelope message;
  std::vector<int> handles;
};
// A worker process is gone (or could not be started). `running_jobs`: the jobs whose in-flight
// markers it still held (what it was doing when it died). `why` names the cause for messages
// ("killed by signal 9", or the supervisor's own reason), `exit_text` the bare exit, exit_code
// the wait status as a shell shows it (128 + signal). fatal: exit status 2, or no start at all.
struct WorkerDown {
  uint32_t slot = 0;
  uint32_t generation = 0;
  std::string why;
  std::string exit_text;
  int32_t exit_code = -1;
  bool fatal = false;
  std::vector<uint64_t> running_jobs;
};
// cuda: the process that owned the device's memory died, and every weight it held with it. The
// device's workers map dead memory: the core kills them, believes nothing more they say, and
// charges no model for their deaths; models whose weights lived there load again on demand
// (parked copies live in host memory and survive).
struct DeviceLost {
  uint32_t device = 0;
  std::string why;
  // It will not come back (its owner cannot run): nothing is placed on the device any more.
  bool for_good = false;
};
// cuda: the device's memory owner is up (at start, or started again after DeviceLost): models may
// be placed on the device again. Until then loads go to other devices, or wait.
struct DeviceRestored {
  uint32_t device = 0;
};
// Time passes (the shell ticks every 50 ms), and how far the shell had read when it ticked:
// everything workers wrote to their channels before workers_read_ms, and everything clients sent
// before clients_read_ms, was handed to the core before this tick.
//
// A timeout that judges a peer (a worker hung, a load stalled, a request past its deadline, the
// drain over, a model idle past its keep_alive) is decided as of those times, never as of the
// tick's own: libuv runs expired timers before it polls for I/O, so after the daemon was stopped
// for a while (SIGSTOP, a VM stall, swap) a tick comes before whatever was sent meanwhile has
// been read, and a worker that answered in time would otherwise be killed as hung. What came
// due after them is judged by a later tick, once the shell has read what came before it.
// kReadAll: as of the tick itself (everything was read).
struct Tick {
  static constexpr uint64_t kReadAll = UINT64_MAX;
  uint64_t workers_read_ms = kReadAll;
  uint64_t clients_read_ms = kReadAll;
};
// SIGHUP: the configuration read again (or why it could not be) and the registry it describes.
struct Reload {
  Result<Config> config = Status();
  std::vector<ModelEntry> entries;
  std::vector<std::string> warnings;
};
// The answer to action::InspectModel: the model's file looked at again.
struct ModelInspected {
  uint32_t model = 0;
  std::string path;           // the path that was inspected
  Result<std::string> resolved = Status();  // where it leads now, under the model roots
  ModelEntry entry;           // the file's description (problem set when it is not loadable)
};
// SIGTERM or SIGINT; or the daemon handed its socket to a new one (`warmpoold --takeover`), whose
// clients are told to reconnect.
struct Stop {
  bool handed_over = false;
};
// The workers are all gone after action::StopWorkers.
struct WorkersStopped {};
// A takeover was accepted: a new daemon maps this one's memory from now on, so none of it is kept
// for reuse here any more (what is kept goes now). The stop follows (Stop::handed_over).
struct HandingOver {};

}  // namespace event

using Event = std::variant<event::ClientRequest, event::ClientGone, event::WorkerSpawned, event::WorkerUp,
                           event::WorkerMessage, event::WorkerDown, event::Tick, event::Reload,
                           event::ModelInspected, event::Stop, event::WorkersStopped,
                           event::DeviceLost, event::DeviceRestored, event::HandingOver>;

}  // namespace warmpool::supervisor
