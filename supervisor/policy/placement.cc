#include "supervisor/policy/placement.h"

#include <algorithm>

namespace warmpool::supervisor::policy {

bool HasRoom(const WorkerView& worker, const Window& window) {
  if (worker.outstanding == 0) return true;
  return worker.outstanding < window.jobs && worker.pending_bytes < window.bytes;
}

uint32_t PickWorkerForLoad(const std::vector<WorkerView>& workers,
                           const std::vector<uint32_t>& busy) {
  const WorkerView* best = nullptr;
  for (const WorkerView& w : workers) {
    if (!w.up || std::find(busy.begin(), busy.end(), w.slot) != busy.end()) continue;
    if (best == nullptr || w.models < best->models ||
        (w.models == best->models && w.outstanding < best->outstanding)) {
      best = &w;
    }
  }
  return best == nullptr ? kNone : best->slot;
}

uint32_t PickIdleWorker(const std::vector<WorkerView>& workers, const std::vector<uint32_t>& busy) {
  const WorkerView* best = nullptr;
  for (const WorkerView& w : workers) {
    if (!w.up || w.outstanding != 0 || std::find(busy.begin(), busy.end(), w.slot) != busy.end()) {
      continue;
    }
    if (best == nullptr || w.models < best->models) best = &w;
  }
  return best == nullptr ? kNone : best->slot;
}

uint32_t PickReplica(const std::vector<WorkerView>& workers, const std::vector<uint32_t>& replicas,
                     const Window& window) {
  const WorkerView* best = nullptr;
  for (uint32_t slot : replicas) {
    const WorkerView& w = workers[slot];
    if (!w.up || !HasRoom(w, window)) continue;
    if (best == nullptr || w.outstanding < best->outstanding) best = &w;
  }
  return best == nullptr ? kNone : best->slot;
}

uint32_t PickReplicaPreferring(const std::vector<WorkerView>& workers, const std::vector<uint32_t>& replicas,
                               const Window& window, uint32_t preferred) {
  const uint32_t least_busy = PickReplica(workers, replicas, window);
  if (preferred == kNone || least_busy == kNone || preferred == least_busy ||
      std::find(replicas.begin(), replicas.end(), preferred) == replicas.end()) {
    return least_busy;
  }
  const WorkerView& w = workers[preferred];
  if (!w.up || !HasRoom(w, window) ||
      w.outstanding > workers[least_busy].outstanding + kPreferredReplicaSlack) {
    return least_busy;
  }
  return preferred;
}

uint32_t PickReplicaToDrop(const std::vector<WorkerView>& workers,
                           const std::vector<uint32_t>& replicas) {
  uint32_t pick = kNone;
  for (uint32_t slot : replicas) {
    if (pick == kNone) {
      pick = slot;
      continue;
    }
    const WorkerView& w = workers[slot];
    const WorkerView& p = workers[pick];
    if (w.models > p.models || (w.models == p.models && w.outstanding > p.outstanding)) pick = slot;
  }
  return pick;
}

std::optional<Move> PlanRebalance(const std::vector<WorkerView>& workers,
                                  const std::vector<PlacedModel>& models) {
  uint32_t idle = kNone;
  for (const WorkerView& w : workers) {
    if (w.up && w.models == 0 && w.outstanding == 0) {
      idle = w.slot;
      break;
    }
  }
  if (idle == kNone) return std::nullopt;
  const PlacedModel* pick = nullptr;
  uint32_t from = kNone;
  for (const PlacedModel& m : models) {
    if (!m.movable) continue;
    uint32_t crowded = kNone;
    for (uint32_t slot : m.workers) {
      if (workers[slot].models < 2) continue;
      if (crowded == kNone || workers[slot].models > workers[crowded].models) crowded = slot;
    }
    if (crowded == kNone) continue;
    if (pick == nullptr || m.waiting > pick->waiting) {
      pick = &m;
      from = crowded;
    }
  }
  if (pick == nullptr) return std::nullopt;
  return Move{pick->model, from, idle};
}

}  // namespace warmpool::supervisor::policy
