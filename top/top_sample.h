// What `warmpool top` knows of the pool at one moment, from either of its two sources: the
// shared-memory segment (everything, read without asking the daemon anything), or, where this user
// may not map the segment, the daemon's status and ps replies (no counters: no rates, no latency,
// no park account). The tracker (top_tracker.h) compares successive samples; the view draws them.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "ipc/warmpool.pb.h"
#include "shm/layout.h"
#include "shm/segment.h"
#include "shm/stats.h"

namespace warmpool::top {

struct DeviceSample {
  uint64_t used_bytes = 0;
  uint64_t budget_bytes = 0;  // 0: unlimited
};

struct ParkSample {
  uint64_t used_bytes = 0;
  uint64_t budget_bytes = 0;  // 0: parking disabled
};

struct ModelSample {
  // Its record in the segment; kNil from the socket, where a model is known by its name only.
  uint32_t record = shm::kNil;
  std::string name;
  shm::ModelState state = shm::ModelState::kRegistered;
  uint32_t device = 0;
  uint64_t bytes = 0;  // weights and workspace, as `ps` counts them
  uint64_t weight_bytes = 0;
  uint64_t loaded_bytes = 0;  // load progress, of weight_bytes
  uint32_t replicas = 0;
  bool pinned = false;
  uint32_t inflight = 0;
  std::string error;
  std::optional<shm::ModelStats> stats;  // the segment only
};

struct WorkerSample {
  uint32_t slot = 0;
  int32_t pid = 0;
  std::string state;  // starting | idle | busy | dead | fatal
  uint32_t device = 0;
  uint32_t restarts = 0;
  uint32_t outstanding = 0;
  std::optional<uint64_t> served;  // the segment only
  std::string last_exit;           // "killed by signal 9 (Killed)"; empty: never exited
  std::vector<std::string> models;
};

struct PoolSample {
  std::chrono::steady_clock::time_point taken{};
  uint64_t taken_unix_ns = 0;
  std::vector<DeviceSample> devices;
  std::optional<ParkSample> park;       // the segment only
  std::optional<shm::PoolStats> stats;  // the segment only
  uint64_t inflight = 0;
  uint64_t queued = 0;
  std::vector<ModelSample> models;
  std::vector<WorkerSample> workers;

  bool from_segment() const { return stats.has_value(); }
};

// A copy of the segment's records as the supervisor last wrote them (the caller checked that it
// still runs). Never blocks the supervisor.
PoolSample SampleSegment(const shm::SegmentView& view);
// The same from the daemon's replies, for a user who may not map the segment.
PoolSample SampleReplies(const v1::StatusReply& status, const v1::PsReply& ps);

// "killed by signal 9 (Killed)" / "exited with status 1" for WorkerRecord::last_exit (128 +
// signal, as the daemon encodes it); empty for -1 (never exited).
std::string ExitText(int32_t last_exit);
// shm::ModelStateName backwards; kRegistered for a name it does not know.
shm::ModelState ModelStateFromName(std::string_view name);

}  // namespace warmpool::top
