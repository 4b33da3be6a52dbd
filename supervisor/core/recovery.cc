// What happens when things go wrong: a worker dies (crash, kill, hang killed by us), a model keeps
// crashing its workers, requests and loads overrun their time. The rule throughout: every request
// is answered exactly once, and nothing but the dead worker's own work is disturbed.
#include <algorithm>
#include <map>

#include "supervisor/core/core.h"

namespace warmpool::supervisor {

using shm::ModelState;

void Core::OnWorkerDown(const event::WorkerDown& down) {
  const uint32_t slot = down.slot;
  const std::string& why = down.why;
  WorkerSlot& w = workers_[slot];
  w.ready = false;
  w.fatal = w.fatal || down.fatal;
  if (!down.exit_text.empty()) w.last_exit = down.exit_text;
  // The in-flight markers say which jobs the worker was running when it died: those jobs (and
  // their models) are the suspects; jobs merely queued behind them are innocent.
  const std::vector<uint64_t>& killers = down.running_jobs;
  if (!killers.empty()) {
    Log(LogLevel::kInfo, "reclaimed {} in-flight markers of worker {}", killers.size(), slot);
  }

  std::vector<uint32_t> suspects;  // models that count a crash
  std::vector<uint64_t> ids;
  for (const auto& [id, job] : jobs_) {
    if (job.worker == slot) ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end());  // job order is arrival order: retries keep it
  std::vector<std::pair<uint32_t, Waiter>> retries;
  std::map<uint32_t, uint32_t> unloads_lost;  // unload jobs that died with the worker, per model
  for (uint64_t id : ids) {
    Job job = std::move(jobs_[id]);
    jobs_.erase(id);
    workers_[slot].outstanding--;
    workers_[slot].pending_bytes -= job.bytes;
    // Workers mark every job they run (inference, load, attach, unload, park) in the in-flight
    // table: a marked job was running when the process died, and only its model is blamed. Jobs
    // merely queued behind it are innocent.
    bool killer = std::find(killers.begin(), killers.end(), id) != killers.end();
    if (job.kind == Job::Kind::kUnload) unloads_lost[job.model]++;
    if (killer) suspects.push_back(job.model);
    if (job.kind != Job::Kind::kInfer) continue;  // loads and unloads: handled with the models below
    index_->Update(job.model, [](shm::ModelRecord& r) { r.inflight--; });
    if (job.answered) continue;  // already told DEADLINE_EXCEEDED
    uint32_t crashes = job.crashes + (killer ? 1 : 0);
    if (crashes >= 2) {
      AnswerError(job.call, Error(Code::kInternal,
                                  "the request crashed its worker twice (last: worker {} {}); it "
                                  "is not retried again",
                                  slot, why));
      continue;
    }
    Waiter w{job.call, true, std::move(job.request), job.deadline_ms, crashes};
    retries.emplace_back(job.model, std::move(w));
  }
  std::sort(suspects.begin(), suspects.end());
  suspects.erase(std::unique(suspects.begin(), suspects.end()), suspects.end());

  for (uint32_t model : index_->LruOrder()) {
    const shm::ModelRecord& r = index_->Get(model);
    ModelRuntime& rt = runtime_[model];
    ModelState state = index_->State(model);
    bool replica = std::find(rt.replica_slots.begin(), rt.replica_slots.end(), slot) !=
                   rt.replica_slots.end();
    bool loading_here = state == ModelState::kLoading && r.worker_slot == slot;
    if (!replica && !loading_here) continue;
    std::erase(rt.replica_slots, slot);
    bool retried = std::any_of(retries.begin(), retries.end(),
                               [&](const auto& r) { return r.first == model; });
    if (state == ModelState::kUnloading && rt.retiring && retried && rt.replica_slots.empty() &&
        rt.unloads_pending == 0 && rt.weights_fd >= 0) {
      // Leaving the registry, but it still owes these requests: keep the weights held (its file
      // may be gone) and let the retries attach them; it leaves once they are answered.
      rt.unload_when_idle = false;
      index_->MarkDetached(model);
    } else if (state == ModelState::kUnloading) {
      // Its unload there went with the process (the mapping too).
      rt.unloads_pending -= std::min(rt.unloads_pending, unloads_lost[model]);
      if (rt.unloads_pending == 0) FinishUnload(model);
    } else if (state == ModelState::kLoading && rt.park_fd >= 0) {
      index_->MarkParked(model);  // an unpark that died: the host copy is still ours
    } else if (!rt.replica_slots.empty()) {
      // Other replicas still serve it from the same weights.
      index_->RemoveReplica(model, rt.workspace_bytes, rt.replica_slots.front());
    } else if (rt.weights_fd >= 0) {
      // The supervisor holds the weights: nothing is lost, the next request attaches them.
      rt.unload_when_idle = false;
      index_->MarkDetached(model);
    } else {
      rt.unload_when_idle = false;
      index_->MarkNotResident(model, ModelState::kRegistered, fmt::format("worker {} {}", slot, why));
    }
  }
  workers_[slot].models = 0;
  for (uint32_t model : suspects) RecordCrash(model, fmt::format("worker {} {}", slot, why));

  // Retried requests go to the front of their model's queue, in their original order; the models
  // reload on another worker or on the respawned one. A model now failed refuses them.
  for (auto it = retries.rbegin(); it != retries.rend(); ++it) {
    runtime_[it->first].waiters.push_front(std::move(it->second));
    queued_++;
  }
  for (uint32_t model : index_->All()) {
    if (!runtime_[model].waiters.empty()) EnsureLoading(model);
  }
  RetryPending();
}

void Core::RecordCrash(uint32_t model, const std::string& why) {
  ModelRuntime& rt = runtime_[model];
  uint64_t now = MonoMs();
  rt.crash_ms.push_back(now);
  while (!rt.crash_ms.empty() && now - rt.crash_ms.front() > config_.crash_loop_window_ms) {
    rt.crash_ms.pop_front();
  }
  if (rt.crash_ms.size() < config_.crash_loop_crashes) return;
  MarkFailed(model, fmt::format("crashed its worker {} times within {} s (last: {})",
                                rt.crash_ms.size(), config_.crash_loop_window_ms / 1000, why));
  rt.crash_ms.clear();
}

void Core::MarkFailed(uint32_t model, const std::string& reason) {
  ModelRuntime& rt = runtime_[model];
  rt.cooldown_ms = rt.cooldown_ms == 0
                       ? config_.failed_cooldown_ms
                       : std::min<uint64_t>(rt.cooldown_ms * 2, config_.failed_cooldown_max_ms);
  rt.failed_until_ms = MonoMs() + rt.cooldown_ms;
  rt.last_error = reason;
  rt.inspected = false;
  // Still resident (its weights survived the crash): let them go; FinishUnload marks it failed.
  if (index_->State(model) == ModelState::kReady) StartUnload(model, /*eviction=*/false);
  ModelState state = index_->State(model);
  if (state == ModelState::kRegistered || state == ModelState::kFailed) {
    index_->MarkNotResident(model, ModelState::kFailed, reason);
  }
  Log(LogLevel::kWarn, "model \"{}\" failed: {}; retried in {} ms at the earliest",
      index_->Get(model).name, reason, rt.cooldown_ms);
  FailWaiters(model, FailedStatus(model));
}

Status Core::FailedStatus(uint32_t model) const {
  const std::string name = index_->Get(model).name;
  int64_t retry = RetryInMs(model);
  return Error(Code::kFailedPrecondition,
               "model \"{}\" failed: {}; {} (or retry now with 'warmpool load {}')", name,
               runtime_[model].last_error,
               retry > 0 ? fmt::format("it will be retried in {:.1f} s", retry / 1000.0)
                         : std::string("the next request retries it"),
               name);
}

void Core::SweepDeadlines() {
  // Checked here, on its own turn of the loop, rather than after each reply: ending the drain
  // closes the sessions and the workers' channels, which no handler half-way through expects.
  if (stopping_) {
    CheckDrained();
    if (drain_ended_) return;
  }
  uint64_t now = MonoMs();
  ExpireIdle(now);
  for (uint32_t model : index_->All()) {
    std::deque<Waiter>& waiters = runtime_[model].waiters;
    for (auto it = waiters.begin(); it != waiters.end();) {
      if (it->deadline_ms != 0 && now > it->deadline_ms) {
        Call call = it->call;
        it = waiters.erase(it);
        queued_--;
        AnswerError(call, Error(Code::kDeadlineExceeded,
                                "model \"{}\" was not ready before the request's deadline",
                                index_->Get(model).name));
      } else {
        ++it;
      }
    }
  }
  std::vector<std::pair<uint32_t, std::string>> to_kill;
  // A worker runs one load at a time (its load thread) and its infers and unloads one at a time in
  // order (its serving thread): only the job at the head of each may be judged as stalled, and its
  // clock starts no earlier than the moment the job before it finished.
  std::vector<uint64_t> head_load(workers_.size(), UINT64_MAX), head_serving(workers_.size(), UINT64_MAX);
  for (const auto& [id, job] : jobs_) {
    uint64_t& head = OnLoadThread(job) ? head_load[job.worker] : head_serving[job.worker];
    head = std::min(head, id);
  }
  for (auto& [id, job] : jobs_) {
    const std::string& name = index_->Get(job.model).name;
    uint64_t since = std::max(job.progress_ms, OnLoadThread(job) ? workers_[job.worker].load_done_ms
                                                                 : workers_[job.worker].serving_done_ms);
    bool head = id == (OnLoadThread(job) ? head_load[job.worker] : head_serving[job.worker]);
    switch (job.kind) {
      case Job::Kind::kInfer:
        if (job.deadline_ms == 0 || now <= job.deadline_ms) break;
        if (!job.answered) {
          job.answered = true;  // the worker's late reply is dropped
          AnswerError(job.call, Error(Code::kDeadlineExceeded,
                                      "inference on \"{}\" did not finish before the deadline",
                                      name));
        }
        if (now > job.deadline_ms + config_.inference_grace_ms) {
          to_kill.emplace_back(job.worker,
                               fmt::format("inference on \"{}\" overran its deadline by {} ms",
                                           name, now - job.deadline_ms));
        }
        break;
      case Job::Kind::kLoad:
      case Job::Kind::kUnload:
      case Job::Kind::kPark:
        if (head && now - since > config_.load_stall_ms) {
          to_kill.emplace_back(job.worker, fmt::format("{} of \"{}\" made no progress for {} ms",
                                                       job.kind == Job::Kind::kLoad     ? "loading"
                                                       : job.kind == Job::Kind::kPark ? "parking"
                                                                                        : "unloading",
                                                       name, now - since));
        }
        break;
    }
  }
  // Killing only asks the kernel; the death arrives through the loop like any other.
  for (const auto& [worker, reason] : to_kill) {
    actions_.push_back(action::KillWorker{worker, reason});
  }
}

void Core::FailEverything(const Status& status) {
  for (uint32_t model : index_->All()) FailWaiters(model, status);
  for (auto& [id, job] : jobs_) {
    if (job.kind == Job::Kind::kInfer && !job.answered) {
      job.answered = true;
      AnswerError(job.call, status);
    }
  }
  for (uint32_t model : index_->All()) {
    std::vector<Call> calls;
    calls.swap(runtime_[model].unload_waiters);
    for (const Call& call : calls) AnswerError(call, status);
    runtime_[model].bulk.clear();
  }
  auto bulk = std::move(bulk_unloads_);
  bulk_unloads_.clear();
  for (auto& [id, b] : bulk) AnswerError(b.call, status);
  pending_admission_.clear();
}

}  // namespace warmpool::supervisor
