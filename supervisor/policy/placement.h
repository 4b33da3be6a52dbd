// Placement as pure functions: which worker loads a model, which replica serves a request, and
// when a model moves to spread the pool over the workers.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace warmpool::supervisor::policy {

struct WorkerView {
  uint32_t slot = 0;
  bool up = false;            // said hello, not dead
  uint32_t models = 0;        // models it holds or is taking (loading, attaching)
  uint32_t outstanding = 0;   // jobs sent and not answered
  uint64_t pending_bytes = 0; // their frame bytes
};

// How much work may wait in one worker's channel: beyond it, requests wait in the daemon, where
// they can still go to another replica, time out, or be dropped when their client leaves.
struct Window {
  uint32_t jobs = 16;
  uint64_t bytes = 64ull << 20;
};
// A worker with nothing outstanding always has room, whatever the size of the job.
bool HasRoom(const WorkerView& worker, const Window& window);

// The up worker with the fewest models, then the fewest outstanding jobs (kNone if none), leaving
// out `busy` (workers that already serve the model).
inline constexpr uint32_t kNone = 0xFFFFFFFFu;
uint32_t PickWorkerForLoad(const std::vector<WorkerView>& workers,
                           const std::vector<uint32_t>& busy = {});

// An up worker with nothing outstanding and the fewest models (kNone if none), leaving out `busy`.
uint32_t PickIdleWorker(const std::vector<WorkerView>& workers,
                        const std::vector<uint32_t>& busy = {});

// Of the model's serving replicas, the one with room and the least outstanding work; kNone when
// every one is full.
uint32_t PickReplica(const std::vector<WorkerView>& workers, const std::vector<uint32_t>& replicas,
                     const Window& window);

// How much busier than the least busy a preferred replica may be and still be picked.
inline constexpr uint32_t kPreferredReplicaSlack = 1;

// PickReplica, but `preferred` (the replica whose prefix cache holds the request's beginning) when
// it is among `replicas`, up, with room, and no more than kPreferredReplicaSlack jobs busier than
// the replica PickReplica would take: a cache hit is worth a little waiting, and a prompt that
// many requests begin with (a system prompt) still spreads over the replicas. kNone: no preference.
uint32_t PickReplicaPreferring(const std::vector<WorkerView>& workers, const std::vector<uint32_t>& replicas,
                               const Window& window, uint32_t preferred);

// When a model has more replicas than it should: the one on the worker with the most models, then
// the most work.
uint32_t PickReplicaToDrop(const std::vector<WorkerView>& workers,
                           const std::vector<uint32_t>& replicas);

struct PlacedModel {
  uint32_t model = 0;
  std::vector<uint32_t> workers;  // its serving replicas
  bool movable = false;           // ready, every replica serving (none attaching or leaving)
  uint32_t waiting = 0;           // requests waiting for room in its workers
};
struct Move {
  uint32_t model = 0;
  uint32_t from = 0;
  uint32_t to = 0;
};
// Spreading: a worker that holds nothing and runs nothing, next to one that holds several models,
// takes one of them (the one with the most requests waiting, else the first); of a model with
// several replicas, the one on its most crowded worker. The move attaches the weights there (no
// copy) and then lets the old replica go. The caller passes one device's workers and models.
std::optional<Move> PlanRebalance(const std::vector<WorkerView>& workers,
                                  const std::vector<PlacedModel>& models);

}  // namespace warmpool::supervisor::policy
