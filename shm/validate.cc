// Validate() reads every record under its seqlock into a private copy and checks the copies, so it
// can run in any process. A supervisor mutating the index while an outside reader validates can make
// two records disagree for an instant; the harness validates at quiescence.
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "shm/inflight.h"
#include "shm/model_index.h"

namespace warmpool::shm {

namespace {

bool WorkerAlive(WorkerState state) {
  return state == WorkerState::kStarting || state == WorkerState::kIdle ||
         state == WorkerState::kBusy;
}

}  // namespace

namespace {

Status ValidateOnce(const SegmentView& view);

}  // namespace

Status Validate(const SegmentView& view) {
  // A snapshot between two of the writer's batches, so that accounts and records agree; a
  // supervisor busy for that long (or killed mid-batch) gets the last reading judged as it is.
  std::atomic_ref<uint64_t> changes(view.header().changes);
  Status last;
  for (int attempt = 0; attempt < 1000; attempt++) {
    uint64_t before = changes.load(std::memory_order_acquire);
    if (before & 1) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
      continue;
    }
    last = ValidateOnce(view);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (changes.load(std::memory_order_relaxed) == before) return last;
  }
  return last.ok() ? ValidateOnce(view) : last;
}

namespace {

Status ValidateOnce(const SegmentView& view) {
  std::optional<SegmentHeader> header = SeqRead(view.header());
  if (!header) return Error(Code::kInternal, "segment header is being written and never settles");
  const SegmentHeader& h = *header;
  std::vector<ModelRecord> models(h.max_models);
  for (uint32_t i = 0; i < h.max_models; i++) {
    std::optional<ModelRecord> r = SeqRead(view.model(i));
    if (!r) return Error(Code::kInternal, "model record {} never settles (seq stuck odd)", i);
    models[i] = *r;
  }
  std::vector<WorkerRecord> workers(h.max_workers);
  for (uint32_t i = 0; i < h.max_workers; i++) {
    std::optional<WorkerRecord> r = SeqRead(view.worker(i));
    if (!r) return Error(Code::kInternal, "worker record {} never settles (seq stuck odd)", i);
    workers[i] = *r;
  }

  // Names: terminated and unique.
  std::set<std::string> names;
  for (uint32_t i = 0; i < h.max_models; i++) {
    const ModelRecord& m = models[i];
    if (static_cast<ModelState>(m.state) == ModelState::kEmpty) continue;
    if (strnlen(m.name, sizeof(m.name)) == sizeof(m.name)) {
      return Error(Code::kInternal, "model {} has an unterminated name", i);
    }
    if (!names.insert(m.name).second) {
      return Error(Code::kInternal, "model name \"{}\" appears twice in the index", m.name);
    }
    if (m.state > static_cast<uint32_t>(ModelState::kUnloading)) {
      return Error(Code::kInternal, "model \"{}\" has unknown state {}", m.name, m.state);
    }
  }

  // LRU: walk from the head; links agree both ways; exactly the resident entries; no cycle.
  std::vector<bool> seen(h.max_models, false);
  uint32_t count = 0, prev = kNil;
  for (uint32_t i = h.lru_head; i != kNil; i = models[i].lru_next) {
    if (i >= h.max_models) return Error(Code::kInternal, "LRU link {} out of range", i);
    if (seen[i]) return Error(Code::kInternal, "LRU list has a cycle at model {}", i);
    seen[i] = true;
    if (models[i].lru_prev != prev) {
      return Error(Code::kInternal, "LRU prev link of \"{}\" is {}, expected {}", models[i].name,
                   models[i].lru_prev, prev);
    }
    prev = i;
    count++;
  }
  if (prev != h.lru_tail) return Error(Code::kInternal, "LRU tail {} but the walk ended at {}", h.lru_tail, prev);
  if (count != h.lru_length) {
    return Error(Code::kInternal, "LRU length {} but the list holds {}", h.lru_length, count);
  }

  std::vector<uint64_t> accounted(kMaxDevices, 0);
  uint64_t parked = 0;
  for (uint32_t i = 0; i < h.max_models; i++) {
    const ModelRecord& m = models[i];
    bool resident = IsResident(static_cast<ModelState>(m.state));
    if (resident != seen[i] || resident != (m.in_lru != 0)) {
      return Error(Code::kInternal,
                   "model \"{}\" is {} but {} in the LRU list (in_lru={})", m.name,
                   ModelStateName(static_cast<ModelState>(m.state)), seen[i] ? "is" : "is not",
                   m.in_lru);
    }
    if (!resident) continue;
    if (static_cast<ModelState>(m.state) == ModelState::kParked) {
      parked += m.weight_bytes + m.workspace_bytes;  // the copy and the KV cache kept with it
      continue;
    }
    if (m.device >= h.device_count) {
      return Error(Code::kInternal, "model \"{}\" is on device {} of {}", m.name, m.device,
                   h.device_count);
    }
    // A ready model with no replica is detached: its weights are held by the supervisor.
    bool detached = static_cast<ModelState>(m.state) == ModelState::kReady && m.replicas == 0 &&
                    m.worker_slot == kNil;
    if (m.worker_slot >= h.max_workers && !detached) {
      return Error(Code::kInternal, "resident model \"{}\" has no worker", m.name);
    }
    accounted[m.device] += m.weight_bytes + m.workspace_bytes;
  }
  for (uint32_t d = 0; d < kMaxDevices; d++) {
    if (accounted[d] != h.device_used_bytes[d]) {
      return Error(Code::kInternal, "device {} accounts {} bytes but its resident models sum to {}",
                   d, h.device_used_bytes[d], accounted[d]);
    }
    if (h.device_budget_bytes[d] != 0 && accounted[d] > h.device_budget_bytes[d]) {
      return Error(Code::kInternal, "device {} holds {} bytes, over its budget of {}", d,
                   accounted[d], h.device_budget_bytes[d]);
    }
  }

  if (parked != h.park_used_bytes) {
    return Error(Code::kInternal, "the park accounts {} bytes but parked models sum to {}",
                 h.park_used_bytes, parked);
  }
  if (parked > h.park_budget_bytes) {
    return Error(Code::kInternal, "parked copies hold {} bytes, over the park budget of {}", parked,
                 h.park_budget_bytes);
  }

  // In-flight: every taken slot belongs to the live generation of a live worker.
  InflightTable inflight(view);
  for (uint32_t i = 0; i < h.max_inflight; i++) {
    uint64_t tag = inflight.Tag(i);
    if (tag == 0) continue;
    uint16_t slot = TagWorker(tag);
    if (slot >= h.max_workers) {
      return Error(Code::kInternal, "in-flight slot {} names worker {} of {}", i, slot,
                   h.max_workers);
    }
    const WorkerRecord& w = workers[slot];
    if (TagGeneration(tag) != w.generation || !WorkerAlive(static_cast<WorkerState>(w.state))) {
      return Error(Code::kInternal,
                   "in-flight slot {} is tagged by worker {} generation {}, but that worker is at "
                   "generation {} ({})",
                   i, slot, TagGeneration(tag), w.generation,
                   WorkerAlive(static_cast<WorkerState>(w.state)) ? "alive" : "dead");
    }
  }
  return OkStatus();
}

}  // namespace

}  // namespace warmpool::shm
