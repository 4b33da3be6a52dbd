// The worker processes as the core sees them: started on its word (action::SpawnWorker), up at
// their hello, down at their death, started again after a backoff (policy::RespawnDelay) unless
// they exited with status 2 (fatal configuration). Their records in the segment are written here
// and only here: state (busy while jobs are outstanding), pid, generation, restarts, the models
// each holds.
#include <algorithm>
#include <cstddef>
#include <cstring>

#include "shm/seqlock.h"
#include "supervisor/core/core.h"

namespace warmpool::supervisor {

using namespace residency;

void Core::SpawnDue() {
  if (stopping_) return;
  for (uint32_t slot = 0; slot < workers_.size(); slot++) {
    WorkerSlot& w = workers_[slot];
    if (w.state != WorkerSlot::State::kDown || MonoMs() < w.respawn_at_ms) continue;
    w.generation++;
    w.state = WorkerSlot::State::kStarting;
    w.started_ms = MonoMs();
    w.started_unix_ns = now_.unix_ns;
    w.pid = 0;
    actions_.push_back(action::SpawnWorker{slot, w.generation});
  }
}

void Core::OnWorkerSpawned(const event::WorkerSpawned& spawned) {
  WorkerSlot& w = workers_[spawned.slot];
  if (w.generation != spawned.generation) return;
  w.pid = spawned.pid;
}

void Core::OnWorkerUp(const event::WorkerUp& up) {
  WorkerSlot& w = workers_[up.slot];
  if (w.generation != up.generation || w.state != WorkerSlot::State::kStarting) return;
  w.state = WorkerSlot::State::kUp;
  w.outstanding = 0;
  w.pending_bytes = 0;
  w.retries = 0;
  Log(LogLevel::kInfo, "worker {} ready (pid {}, generation {})", up.slot, w.pid, up.generation);
  // Models that wait for a worker (or for room a worker brings), replicas short of their target,
  // and models stacked on another worker.
  RetryPending();
  for (uint32_t model : index_->All()) {
    if (!models_[model].waiters.empty()) TryAdmit(model);
  }
  Rebalance();
}

void Core::KillWorker(uint32_t slot, const std::string& reason) {
  WorkerSlot& w = workers_[slot];
  if (w.killing || (w.state != WorkerSlot::State::kUp && w.state != WorkerSlot::State::kStarting)) {
    return;
  }
  w.killing = true;
  Log(LogLevel::kWarn, "killing worker {} (pid {}): {}", slot, w.pid, reason);
  actions_.push_back(action::KillWorker{slot, reason});
}

void Core::JobDone(Job& job) {
  WorkerSlot& w = workers_[job.worker];
  w.outstanding -= std::min<uint32_t>(w.outstanding, 1);
  w.pending_bytes -= std::min(w.pending_bytes, job.frame_bytes);
  w.retries -= job.retry && w.retries > 0 ? 1 : 0;
  w.served++;
  if (job.kind == Job::Kind::kInfer) infer_jobs_--;
  (OnLoadThread(job) ? w.load_done_ms : w.serving_done_ms) = MonoMs();
  ReturnFaults(job);
}

void Core::PublishWorkers() {
  std::vector<std::vector<uint32_t>> held(workers_.size());
  for (uint32_t model : index_->LruOrder()) {
    models_[model].machine.ForEachWorker([&](uint32_t worker) { held[worker].push_back(model); });
  }
  for (uint32_t slot = 0; slot < workers_.size(); slot++) {
    const WorkerSlot& w = workers_[slot];
    shm::WorkerState state = shm::WorkerState::kEmpty;
    switch (w.state) {
      case WorkerSlot::State::kDown:
        state = w.generation == 0 ? shm::WorkerState::kEmpty : shm::WorkerState::kDead;
        break;
      case WorkerSlot::State::kStarting: state = shm::WorkerState::kStarting; break;
      case WorkerSlot::State::kUp:
        state = w.outstanding > 0 ? shm::WorkerState::kBusy : shm::WorkerState::kIdle;
        break;
      case WorkerSlot::State::kFatal: state = shm::WorkerState::kFatal; break;
    }
    // This runs after every event: a record is rewritten (and its readers made to retry) only
    // when something in it changed. The core is the segment's only writer.
    shm::WorkerRecord next = segment_.worker(slot);
    next.state = static_cast<uint32_t>(state);
    next.pid = w.pid;
    next.generation = w.generation;
    next.device = DeviceOf(slot);
    next.restarts = w.restarts;
    next.last_exit = w.last_exit_code;
    next.models = static_cast<uint32_t>(held[slot].size());
    next.started_ns = w.started_unix_ns;
    next.served = w.served;
    next.outstanding = w.outstanding;
    for (uint32_t i = 0; i < shm::kWorkerModelsShown; i++) {
      next.held[i] = i < held[slot].size() ? held[slot][i] : shm::kNil;
    }
    if (std::memcmp(&next, &segment_.worker(slot), sizeof(next)) == 0) continue;
    static_assert(offsetof(shm::WorkerRecord, seq) == 0);
    constexpr size_t kAfterSeq = sizeof(shm::WorkerRecord::seq);
    shm::SeqWrite(segment_.worker(slot), [&](shm::WorkerRecord& r) {
      // Everything but the sequence, which SeqWrite owns.
      std::memcpy(reinterpret_cast<char*>(&r) + kAfterSeq,
                  reinterpret_cast<const char*>(&next) + kAfterSeq, sizeof(r) - kAfterSeq);
    });
  }
}

}  // namespace warmpool::supervisor
