// What happens when things go wrong: a worker dies (crash, kill, a hang killed by us), a model
// keeps crashing its workers, requests and loads overrun their time. The rule throughout: every
// request is answered exactly once, and nothing but the dead worker's own work is disturbed.
#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "supervisor/core/core.h"

namespace warmpool::supervisor {

using namespace residency;

void Core::OnWorkerDown(const event::WorkerDown& down) {
  const uint32_t slot = down.slot;
  WorkerSlot& w = workers_[slot];
  bool alive = w.state == WorkerSlot::State::kStarting || w.state == WorkerSlot::State::kUp;
  if (down.generation != w.generation || !alive) return;  // an earlier life of the slot: done with
  w.state = down.fatal ? WorkerSlot::State::kFatal : WorkerSlot::State::kDown;
  const bool we_killed = w.killing || w.device_lost;
  w.killing = false;
  w.last_exit = down.exit_text;
  w.last_exit_code = down.exit_code;
  if (!down.fatal && !stopping_) {
    w.restarts++;
    const auto reason = we_killed ? shm::RestartReason::kKilled : shm::RestartReason::kCrashed;
    shm::StatAdd(segment_.pool_stats().restarts[static_cast<uint32_t>(reason)]);
    w.backoff_ms = policy::RespawnDelay(w.backoff_ms, MonoMs() - w.started_ms, RetrySettings());
    w.respawn_at_ms = MonoMs() + w.backoff_ms;
  }
  if (!drain_ended_) {
    if (down.fatal) {
      Log(LogLevel::kCritical, "worker {} {} (fatal configuration); not respawning it: fix the "
          "configuration and restart warmpoold", slot, down.why);
    } else {
      Log(LogLevel::kWarn, "worker {} (pid {}) {}; respawning in {} ms", slot, w.pid, down.why,
          w.backoff_ms);
    }
  }
  // The in-flight markers say which jobs the worker was running when it died: those jobs (and
  // their models) are the suspects; jobs merely queued behind them are innocent. A suspect that
  // ran alone is charged the crash; one of several running at once (a batch, an inference beside a
  // load) may be innocent: it is retried alone, and only a few such crashes end it.
  const std::vector<uint64_t>& running = down.running_jobs;
  if (!running.empty()) {
    Log(LogLevel::kInfo, "reclaimed {} in-flight markers of worker {}", running.size(), slot);
  }
  std::vector<uint64_t> ids;
  for (const auto& [id, job] : jobs_) {
    if (job.worker == slot) ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end());  // job order is arrival order: retries keep it
  std::set<uint32_t> suspects;
  std::set<uint32_t> running_models;  // of every job that was running, any version
  std::vector<std::pair<uint32_t, Waiter>> retries;
  for (uint64_t id : ids) {
    Job job = std::move(jobs_[id]);
    jobs_.erase(id);
    JobDone(job);
    bool killer = std::find(running.begin(), running.end(), id) != running.end();
    bool current = job.epoch == models_[job.model].epoch;
    Model& m = models_[job.model];
    if (killer && current) suspects.insert(job.model);
    if (killer) running_models.insert(job.model);
    switch (job.kind) {
      case Job::Kind::kInfer: {
        if (current) {
          m.inflight--;
          index_->Update(job.model, [&](shm::ModelRecord& r) { r.inflight = m.inflight; });
        }
        if (job.answered) break;  // already told DEADLINE_EXCEEDED, or its client is gone
        const bool charged = killer && !w.device_lost;
        // Part of the stream is the client's already: running it again would send it twice. A
        // generation resumes instead, on another worker, after the tokens the client has (the
        // engine computes them again and goes on from there) — unless it has tools (what the
        // worker's reader of tool calls held back is not the core's to know), a chunk of text
        // alone went out (it would go out again), or the model was reloaded meanwhile.
        if (job.chunks > 0 && (!job.resumable || !current)) {
          AnswerError(job.call, Error(Code::kUnavailable,
                                      "the worker generating for \"{}\" died after {} chunks (worker {} {}); "
                                      "what was sent stands, the rest is lost: ask again",
                                      m.entry.name, job.chunks, slot, down.why));
          break;
        }
        uint32_t crashes = job.crashes + (charged && running.size() == 1 ? 1 : 0);
        uint32_t shared = job.shared_crashes + (charged && running.size() > 1 ? 1 : 0);
        if (!policy::RetryAfterCrash(crashes, shared) || !current) {
          AnswerError(job.call, Error(Code::kInternal,
                                      "the request was running when its worker died {} times (last: "
                                      "worker {} {}); it is not retried again",
                                      crashes + shared, slot, down.why));
          break;
        }
        retries.emplace_back(job.model, Waiter{job.call, true, std::move(job.request),
                                               job.deadline_ms, crashes, shared, /*retry=*/true});
        retries.back().second.generate = std::move(job.generate);
        if (retries.back().second.generate) {  // remembered where it resumes, with the copied keys and values
          retries.back().second.prefix_keys = PrefixKeys(*retries.back().second.generate);
        }
        retries.back().second.embed = std::move(job.embed);
        retries.back().second.chunks = job.chunks;
        retries.back().second.sent_tokens = std::move(job.sent_tokens);
        retries.back().second.resume_epoch = job.epoch;
        retries.back().second.resume_version = m.entry.version;
        retries.back().second.kv_source = job.kv_source;  // an earlier death's, not read yet
        break;
      }
      case Job::Kind::kLoad:
        if (const Loading* l = m.machine.As<Loading>(); current && l != nullptr && l->job == id) {
          m.machine.AbandonLoad();  // nothing was held yet: the next request loads again
        }
        break;
      case Job::Kind::kUnpark:
        if (const Unparking* u = m.machine.As<Unparking>(); current && u != nullptr && u->job == id) {
          m.machine.AbandonUnpark();  // the host copy is still ours
        }
        break;
      case Job::Kind::kPark:
        if (Releasing* r = m.machine.As<Releasing>(); current && r != nullptr && r->park_job == id) {
          r->park_job = 0;  // no copy: the weights are dropped
        }
        break;
      case Job::Kind::kAttach:
      case Job::Kind::kUnload:
        break;  // the replica goes with the worker, below
    }
  }
  // Every replica the worker held goes with it (its mapping too); the weights stay held.
  for (uint32_t model : index_->LruOrder()) {
    ModelMachine& machine = models_[model].machine;
    if ((machine.Is<Ready>() || machine.Is<Releasing>()) && machine.HasWorker(slot)) {
      machine.DropReplica(slot);
    }
  }
  for (uint32_t model : index_->LruOrder()) {
    const Releasing* r = models_[model].machine.As<Releasing>();
    if (r == nullptr) continue;
    if (r->draining && models_[model].inflight == 0) SendRelease(model);
    else if (!r->draining && r->replicas.empty() && r->park_job == 0) FinishRelease(model);
  }
  // A worker killed because its device's memory died crashed through no model's fault.
  if (!w.device_lost) {
    // A model is charged in full only when its jobs ran alone; beside another model's it may be
    // innocent (policy::ChargeCrash).
    const bool alone = running_models.size() == 1;
    for (uint32_t model : suspects) ChargeCrash(model, fmt::format("worker {} {}", slot, down.why), alone);
  }
  w.device_lost = false;
  // Retried requests go to the front of their model's queue, taking turns between connections
  // (each one's in its original order), those that were running at a crash last (TakingTurns): a
  // client that had one request on the dead worker does not wait for all of another's. The models reload (or re-attach their held weights) on
  // another worker or the respawned one. A model now failed refuses them.
  // Retries of an earlier death still waiting keep their place ahead of these.
  HandCachesToRetries(slot, retries);
  retries = TakingTurns(std::move(retries));
  for (auto& [model, waiter] : retries) {
    std::deque<Waiter>& waiters = models_[model].waiters;
    auto after_retries = std::find_if(waiters.begin(), waiters.end(), [](const Waiter& w) { return !w.retry; });
    waiters.insert(after_retries, std::move(waiter));
    queued_++;
  }
  for (uint32_t model : index_->All()) {
    if (!models_[model].waiters.empty()) TryAdmit(model);
  }
  RetryPending();
}

std::vector<std::pair<uint32_t, Core::Waiter>> Core::TakingTurns(
    std::vector<std::pair<uint32_t, Waiter>> retries) {
  // Requests that were running at a crash (this one or an earlier) go after those that never
  // were: they may bring the worker down again, the others cannot, and need not wait for them.
  // Within each, a connection's k-th request goes in turn k; within a turn, connections with fewer
  // requests to retry go first (a client that lost one request gets it back before one that lost
  // many), then arrival order.
  using Key = std::pair<bool, uint64_t>;  // (suspect, session)
  auto key = [&](size_t i) {
    const Waiter& w = retries[i].second;
    return Key{w.crashes + w.shared_crashes > 0, w.call.session};
  };
  std::map<Key, uint32_t> count, taken;
  for (size_t i = 0; i < retries.size(); i++) count[key(i)]++;
  struct Place {
    bool suspect;
    uint32_t turn, of;
    size_t arrival;
    bool operator<(const Place& o) const {
      return std::tie(suspect, turn, of, arrival) < std::tie(o.suspect, o.turn, o.of, o.arrival);
    }
  };
  std::vector<Place> places(retries.size());
  for (size_t i = 0; i < retries.size(); i++) places[i] = {key(i).first, taken[key(i)]++, count[key(i)], i};
  std::sort(places.begin(), places.end());
  std::vector<std::pair<uint32_t, Waiter>> turns;
  turns.reserve(retries.size());
  for (const Place& p : places) turns.push_back(std::move(retries[p.arrival]));
  return turns;
}

void Core::OnDeviceLost(const event::DeviceLost& lost) {
  if (lost.device >= DeviceCount()) return;
  Log(LogLevel::kError, "the memory of device {} is gone ({}): its workers are restarted, and its "
      "models load again on demand{}", lost.device, lost.why,
      lost.for_good ? "; nothing is placed on it any more" : "");
  // Nothing is placed there until its owner is back (DeviceRestored), or ever again.
  devices_down_[lost.device] = true;
  if (lost.for_good) devices_gone_[lost.device] = true;
  // The device's workers map memory that no longer exists: nothing they report from now on is
  // believed, and their deaths (below, as the kills land) retry their requests without charging
  // a model. Other devices' workers and models are not touched.
  for (uint32_t slot = 0; slot < workers_.size(); ++slot) {
    if (DeviceOf(slot) != lost.device) continue;
    WorkerSlot& w = workers_[slot];
    if (w.state != WorkerSlot::State::kUp && w.state != WorkerSlot::State::kStarting) continue;
    w.device_lost = true;
    KillWorker(slot, fmt::format("the memory owner of device {} died", lost.device));
  }
  // Resident weights are gone: let them go without a parked copy (nothing can be read from
  // them). Their replicas go with their workers; the handles close when the last has.
  for (uint32_t model : index_->All()) {
    Model& m = models_[model];
    if (m.machine.Device() != lost.device) continue;
    if (m.machine.Is<Ready>() && !stopping_) {
      Release(model, shm::ReleaseReason::kFailure, /*allow_park=*/false,
              fmt::format("the memory of device {} was lost", lost.device));
    }
    if (Releasing* r = m.machine.As<Releasing>()) r->park = false;  // a copy already made survives
  }
  // Waiting requests may go to another device now.
  RetryPending();
}

void Core::OnDeviceRestored(const event::DeviceRestored& restored) {
  if (restored.device >= DeviceCount() || devices_gone_[restored.device] || !devices_down_[restored.device]) return;
  devices_down_[restored.device] = false;
  Log(LogLevel::kInfo, "device {} is back: models may be placed on it again", restored.device);
  RetryPending();
  for (uint32_t model : index_->All()) {
    if (!models_[model].waiters.empty()) TryAdmit(model);
  }
}

void Core::OnModelInspected(const event::ModelInspected& inspected) {
  const uint32_t model = inspected.model;
  Model& m = models_[model];
  Failed* failed = m.machine.As<Failed>();
  if (failed == nullptr || !failed->inspecting || inspected.path != m.entry.path) return;  // stale
  failed->inspecting = false;
  if (!m.entry.path.empty() && (!inspected.resolved.ok() || *inspected.resolved != m.entry.path)) {
    return MarkFailed(model, inspected.resolved.ok()
                                 ? fmt::format("model path {} leads to {} now; reload to register "
                                               "it again",
                                               m.entry.path, *inspected.resolved)
                                 : inspected.resolved.status().message(),
                      /*file_broken=*/!inspected.resolved.ok());
  }
  const ModelEntry& entry = inspected.entry;
  if (!entry.problem.ok()) return MarkFailed(model, entry.problem.message(), entry.problem_in_file);
  FollowFile(model, entry);
  m.machine.Recover();  // loadable again: through admission like any other
  TryAdmit(model);
}

void Core::SweepDeadlines(uint64_t as_of) {
  // `now` is the time up to which the workers' channels had been read, which a late tick puts
  // before its own: a worker whose reply was written before then has been heard, one whose reply
  // came later had indeed overrun. Judged as of the tick's own time, a reply waiting unread in the
  // socket after a pause would be dropped and its healthy worker killed.
  const uint64_t now = as_of;
  for (uint32_t model : index_->All()) {
    Model& m = models_[model];
    bool ready = m.machine.Serving();
    for (auto it = m.waiters.begin(); it != m.waiters.end();) {
      if (it->deadline_ms == 0 || now <= it->deadline_ms) {
        ++it;
        continue;
      }
      Call call = it->call;
      const bool retry = it->retry;
      it = m.waiters.erase(it);
      queued_--;
      if (retry) {
        AnswerError(call, Error(Code::kDeadlineExceeded,
                                "the request's worker died while it held it, and its retry did not "
                                "get its turn on a worker serving \"{}\" before the deadline",
                                m.entry.name));
        continue;
      }
      AnswerError(call, ready ? Error(Code::kDeadlineExceeded,
                                      "no worker serving \"{}\" had room before the request's "
                                      "deadline (they are busy: add replicas or workers)",
                                      m.entry.name)
                              : Error(Code::kDeadlineExceeded,
                                      "model \"{}\" was not ready before the request's deadline",
                                      m.entry.name));
    }
  }
  // The job each worker's serving thread runs now: the lowest id sent there (it runs them in order).
  std::vector<uint64_t> running(workers_.size(), UINT64_MAX);
  for (const auto& [id, job] : jobs_) {
    if (!OnLoadThread(job)) running[job.worker] = std::min(running[job.worker], id);
  }
  for (auto& [id, job] : jobs_) {
    if (job.kind != Job::Kind::kInfer || job.deadline_ms == 0 || now <= job.deadline_ms) continue;
    if (!job.answered) {
      job.answered = true;  // the worker's late reply is dropped
      AnswerError(job.call, Error(Code::kDeadlineExceeded,
                                  "inference on \"{}\" did not finish before the deadline",
                                  models_[job.model].entry.name));
      job.request.Clear();  // no retry for it: let its input go
    }
    // Only the job the worker runs can overrun: one queued behind another (a long generation) has
    // not begun, and the worker skips it, past its deadline, when its turn comes. The grace runs
    // from when the worker got to it: one dispatched already past its deadline (its load came in
    // late, after a pause), or reached only now, has not had its grace yet.
    if (id != running[job.worker]) continue;
    const uint64_t reached = std::max({job.deadline_ms, job.started_ms, workers_[job.worker].serving_done_ms});
    if (now > reached + config_.inference_grace_ms) {
      KillWorker(job.worker, fmt::format("inference on \"{}\" overran its deadline by {} ms",
                                         models_[job.model].entry.name, MonoMs() - job.deadline_ms));
    }
  }
}

void Core::SweepStalls(uint64_t as_of) {
  // As of the workers' reading, as SweepDeadlines: their progress reports may wait unread.
  const uint64_t now = as_of;
  // A worker runs one load at a time (its load thread) and everything else one at a time in
  // order (its serving thread): only the job at the head of each may be judged as stalled, and
  // its clock starts no earlier than the moment the job before it finished.
  std::vector<uint64_t> head_load(workers_.size(), UINT64_MAX);
  std::vector<uint64_t> head_serving(workers_.size(), UINT64_MAX);
  for (const auto& [id, job] : jobs_) {
    uint64_t& head = OnLoadThread(job) ? head_load[job.worker] : head_serving[job.worker];
    head = std::min(head, id);
  }
  for (const auto& [id, job] : jobs_) {
    // An inference is judged by its deadline; a generation, embeddings or typed tensors (which
    // may have none) by its steps.
    if (job.kind == Job::Kind::kInfer && !job.stepwise) continue;
    bool load_thread = OnLoadThread(job);
    if (id != (load_thread ? head_load[job.worker] : head_serving[job.worker])) continue;
    const WorkerSlot& w = workers_[job.worker];
    uint64_t since = std::max(job.progress_ms, load_thread ? w.load_done_ms : w.serving_done_ms);
    if (now <= since || now - since <= config_.load_stall_ms) continue;  // heard from after `now`
    static constexpr const char* kWhat[] = {"loading", "attaching", "unparking", "generating",
                                            "unloading", "parking"};
    KillWorker(job.worker, fmt::format("{} of \"{}\" made no progress for {} ms",
                                       job.embed                                           ? "embedding"
                                       : job.kind == Job::Kind::kInfer && !job.generate ? "running tensors"
                                                                                          : kWhat[static_cast<int>(job.kind)],
                                       models_[job.model].entry.name, MonoMs() - since));
  }
}

void Core::FailEverything(const Status& status) {
  for (uint32_t model : index_->All()) {
    FailWaiters(model, status);
    std::vector<Call> calls;
    calls.swap(models_[model].unload_waiters);
    for (const Call& call : calls) AnswerError(call, status);
    models_[model].bulk.clear();
  }
  for (auto& [id, job] : jobs_) {
    if (job.kind == Job::Kind::kInfer && !job.answered) {
      job.answered = true;
      AnswerError(job.call, status);
    }
  }
  auto bulk = std::move(bulk_unloads_);
  bulk_unloads_.clear();
  for (auto& [id, b] : bulk) AnswerError(b.call, status);
  pending_admission_.clear();
}

}  // namespace warmpool::supervisor
