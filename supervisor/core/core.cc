// Events in, actions out; the start, the tick, the status line and the stop.
#include "supervisor/core/core.h"

#include <algorithm>

#include "ipc/framing.h"

namespace warmpool::supervisor {

Core::Core(Config config, shm::SegmentView segment)
    : config_(std::move(config)), segment_(segment) {
  index_ = std::make_unique<shm::ModelIndex>(segment);
  index_->SetParkBudget(config_.park_budget_bytes);
  if (config_.single_active) config_.capacity = 1;  // switching releases (parks) the active one
  models_.resize(config_.max_models);
  for (uint32_t i = 0; i < models_.size(); i++) models_[i].machine.Bind(index_.get(), i);
  if (config_.devices.empty()) config_.devices.push_back(DeviceConfig{"", 0, config_.budget_bytes});
  WARMPOOL_CHECK(config_.workers_per_device > 0 && DeviceCount() == index_->DeviceCount());
  workers_.resize(config_.workers_per_device * DeviceCount());
  devices_down_.resize(DeviceCount(), false);
  devices_gone_.resize(DeviceCount(), false);
}

Core::~Core() = default;

std::vector<Action> Core::Start(std::vector<ModelEntry> entries, std::vector<std::string> warnings,
                                Time now, std::vector<KeptWeights> kept) {
  now_ = now;
  index_->BeginChanges();
  for (const ModelEntry& m : entries) RegisterModel(m);
  for (const std::string& w : warnings) Log(LogLevel::kWarn, "{}", w);
  if (!kept.empty()) Adopt(std::move(kept));
  SpawnDue();
  Preload();
  next_status_ms_ = MonoMs() + kStatusPeriodMs;
  CheckPreload();
  PublishWorkers();
  PublishGauges();
  index_->EndChanges();
  StoreKeptWhenDue(/*now=*/true);  // also lets go of what the start was given and did not adopt
  return std::move(actions_);
}

std::vector<Action> Core::Handle(Event event, Time now) {
  now_ = now;
  // Everything one event changes in the segment is one batch for observers (Validate).
  index_->BeginChanges();
  std::visit(
      [&](auto&& e) {
        using E = std::decay_t<decltype(e)>;
        if constexpr (std::is_same_v<E, event::ClientRequest>) OnRequest(std::move(e));
        else if constexpr (std::is_same_v<E, event::ClientGone>) OnClientGone(e.session);
        else if constexpr (std::is_same_v<E, event::WorkerSpawned>) OnWorkerSpawned(e);
        else if constexpr (std::is_same_v<E, event::WorkerUp>) OnWorkerUp(e);
        else if constexpr (std::is_same_v<E, event::WorkerMessage>) OnWorkerMessage(std::move(e));
        else if constexpr (std::is_same_v<E, event::WorkerDown>) OnWorkerDown(e);
        else if constexpr (std::is_same_v<E, event::Tick>) OnTick(e);
        else if constexpr (std::is_same_v<E, event::Reload>) Reload(std::move(e));
        else if constexpr (std::is_same_v<E, event::ModelInspected>) OnModelInspected(e);
        else if constexpr (std::is_same_v<E, event::Stop>) BeginStop(e.handed_over);
        else if constexpr (std::is_same_v<E, event::WorkersStopped>) stopped_ = true;
        else if constexpr (std::is_same_v<E, event::DeviceLost>) OnDeviceLost(e);
        else if constexpr (std::is_same_v<E, event::DeviceRestored>) OnDeviceRestored(e);
        else if constexpr (std::is_same_v<E, event::HandingOver>) OnHandingOver();
      },
      std::move(event));
  // Forgetting a model frees its record for reuse: done here, when nothing up the stack holds it.
  if (!drain_ended_) ProcessRetirements();
  ForgetKvCaches();
  CheckDrained();
  PublishWorkers();
  TrimKept();
  index_->EndChanges();
  // At the end of a stop, the LRU order as it is then, for the next start.
  StoreKeptWhenDue(/*now=*/stopped_);
  return std::move(actions_);
}

void Core::PublishGauges() {
  shm::PoolStats& pool = segment_.pool_stats();
  shm::StatStore(pool.inflight, infer_jobs_);
  shm::StatStore(pool.queued, queued_);
  if (shm::StatLoad(pool.started_unix_ns) == 0) shm::StatStore(pool.started_unix_ns, now_.unix_ns);
  // Language models' serving gauges (shm/stats.h): what a router reads to choose a node.
  std::vector<uint64_t> running(models_.size()), generating(models_.size());
  for (const auto& [id, job] : jobs_) {
    if (job.epoch != models_[job.model].epoch) continue;
    if (job.generate || job.embed) running[job.model]++;
    if (job.generate) generating[job.model]++;
  }
  for (uint32_t model : index_->All()) {
    const Model& m = models_[model];
    if (!m.entry.generates()) continue;
    shm::ModelStats& stats = segment_.model_stats(model);
    shm::StatStore(stats.sequences_running, running[model]);
    shm::StatStore(stats.generations_running, generating[model]);
    shm::StatStore(stats.requests_waiting, m.waiters.size());
    // The sequences the serving replicas' engines hold, a KV cache each.
    const residency::Ready* ready = m.machine.As<residency::Ready>();
    const uint64_t per_replica = std::max<uint32_t>(ready != nullptr ? ready->weights.sequences : 1, 1);
    shm::StatStore(stats.sequences_held, m.machine.ServingWorkers().size() * per_replica);
    // What the serving replicas' engines said of their caches' blocks (none said: 0 of 0).
    uint64_t blocks_held = 0, blocks = 0;
    for (uint32_t worker : m.machine.ServingWorkers()) {
      if (auto it = kv_usage_.find({model, worker}); it != kv_usage_.end()) {
        blocks_held += it->second.held;
        blocks += it->second.blocks;
      }
    }
    shm::StatStore(stats.kv_blocks_held, blocks_held);
    shm::StatStore(stats.kv_blocks, blocks);
  }
}

void Core::Send(uint32_t worker, const v1::WorkerEnvelope& message, std::vector<int> handles) {
  actions_.push_back(action::SendToWorker{worker, ipc::Frame(message), std::move(handles), 0, 0, {}, -1});
}

void Core::SendAllocating(uint32_t worker, const v1::WorkerEnvelope& message, uint64_t job, uint64_t bytes,
                          std::vector<int> handles) {
  // Kept memory goes to the first job that allocates, before the trim at the end of the event:
  // under a full budget the region kept is the one this job's eviction freed, and the job's bytes
  // are counted as used already.
  std::optional<KeptMemory::Region> kept = bytes > 0 ? kept_memory_.Take(bytes) : std::nullopt;
  const int offer = kept ? kept->handle : -1;
  actions_.push_back(action::SendToWorker{worker, ipc::Frame(message), std::move(handles), bytes, job, {}, offer});
}

void Core::Close(int handle) {
  if (handle < 0) return;
  adopted_memory_.erase(handle);
  actions_.push_back(action::CloseHandle{handle, /*keep=*/false});
}

void Core::Close(const std::vector<int>& handles) {
  for (int h : handles) Close(h);
}

void Core::CloseMemory(int handle, uint64_t bytes) {
  if (handle < 0) return;
  // Only the host backend's memory is a region of its own to reuse (on cuda it is the owner's),
  // and the host backend has one device, whose budget the kept memory counts against; memory a
  // daemon before this one kept may still be mapped by its workers, and once a takeover is under
  // way by the new daemon's.
  const bool adopted = adopted_memory_.erase(handle) != 0;
  const bool keep = KeepsFreedMemory() && !handing_over_ && !adopted && bytes > 0;
  if (keep) kept_memory_.Keep(handle, bytes);
  actions_.push_back(action::CloseHandle{handle, keep});
}

void Core::CloseMemory(const std::vector<int>& handles, uint64_t bytes) {
  for (int h : handles) CloseMemory(h, bytes);
}

void Core::TrimKept() {
  if (kept_memory_.size() == 0) return;
  const uint64_t used = index_->DeviceUsed(0), budget = index_->DeviceBudget(0);
  for (int handle : kept_memory_.TrimTo(budget > used ? budget - used : 0)) {
    actions_.push_back(action::DropKept{handle});
  }
}

void Core::OnHandingOver() {
  handing_over_ = true;
  for (int handle : kept_memory_.TrimTo(0)) actions_.push_back(action::DropKept{handle});
}

policy::Limits Core::Limits() const {
  return policy::Limits{0, config_.capacity, config_.max_cached, config_.park_budget_bytes,
                        config_.single_active};
}

bool Core::DeviceUsable(uint32_t device) const {
  if (devices_gone_[device]) return false;
  for (uint32_t slot = device * config_.workers_per_device; slot < (device + 1) * config_.workers_per_device; slot++) {
    if (workers_[slot].state != WorkerSlot::State::kFatal) return true;
  }
  return false;
}

bool Core::Fits(uint32_t device, uint64_t bytes) const {
  return Budget(device) == 0 || index_->DeviceUsed(device) + bytes <= Budget(device);
}

policy::RetrySettings Core::RetrySettings() const {
  return policy::RetrySettings{config_.crash_loop_crashes,  config_.crash_loop_window_ms,
                               config_.failed_cooldown_ms,  config_.failed_cooldown_max_ms,
                               config_.respawn_min_ms,      config_.respawn_max_ms,
                               config_.respawn_stable_ms};
}

uint64_t Core::NewJob(Job&& job) {
  uint64_t id = next_job_++;
  job.started_ms = MonoMs();
  job.progress_ms = job.started_ms;
  job.epoch = models_[job.model].epoch;
  if (job.kind == Job::Kind::kLoad || job.kind == Job::Kind::kAttach || job.kind == Job::Kind::kUnpark) {
    job.load_thread = true;
  }
  WorkerSlot& w = workers_[job.worker];
  w.outstanding++;
  w.pending_bytes += job.frame_bytes;
  w.retries += job.retry ? 1 : 0;
  if (job.kind == Job::Kind::kInfer) infer_jobs_++;
  jobs_.emplace(id, std::move(job));
  return id;
}

Core::Job* Core::FindJob(uint64_t id) {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : &it->second;
}

std::vector<std::pair<uint32_t, int>> Core::HeldHandles() const {
  std::vector<std::pair<uint32_t, int>> held;
  for (uint32_t model = 0; model < models_.size(); model++) {
    for (int h : models_[model].machine.Handles()) held.emplace_back(model, h);
  }
  for (const auto& [id, session] : sessions_) {
    for (const auto& [region_id, region] : session.regions) held.emplace_back(shm::kNil, region.handle);
  }
  for (const auto& [replica, cache] : replica_caches_) held.emplace_back(replica.first, cache.handle);
  for (const auto& [handle, source] : kv_sources_) held.emplace_back(shm::kNil, handle);
  return held;
}

void Core::OnTick(const event::Tick& tick) {
  PublishGauges();  // a tick apart at most: observers sample them far less often
  if (drain_ended_) return;
  // Judgements of peers are made as of what the shell had read (event::Tick): a late tick (the
  // daemon was paused) judges nothing that came due after its reading; the next tick does, once
  // what was sent meanwhile has been read. Spawning and rebalancing judge no one: as of now.
  const uint64_t workers_read = std::min(MonoMs(), tick.workers_read_ms);
  const uint64_t clients_read = std::min(MonoMs(), tick.clients_read_ms);
  SpawnDue();
  SweepDeadlines(workers_read);
  SweepStalls(workers_read);
  ExpireIdle(clients_read);  // a request for the model may wait unread in a client's socket
  Rebalance();
  // The drain ends early only when no worker's answer to a request it holds waits unread.
  if (stopping_ && workers_read >= drain_deadline_ms_) return EndDrain("the drain timeout");
  if (MonoMs() < next_status_ms_) return;
  next_status_ms_ = MonoMs() + kStatusPeriodMs;
  OnStatusTick();
}

void Core::OnStatusTick() {
  CheckPreload();
  if (ready_sent_) actions_.push_back(action::Notify{action::Notify::Kind::kStatus, StatusLine()});
}

void Core::Preload() {
  for (const std::string& name : config_.preload) {
    uint32_t model = index_->Find(name);
    if (model == shm::kNil) {
      Log(LogLevel::kWarn, "preload: model \"{}\" is not registered; skipped", name);
      continue;
    }
    preloading_.push_back(model);
    // A load with nobody to answer (session 0): it starts as soon as a worker is up.
    Enqueue(model, Waiter{Call{0, 0, 0}, false, {}, 0, 0});
  }
  if (!preloading_.empty()) Log(LogLevel::kInfo, "preloading {} model(s)", preloading_.size());
}

void Core::CheckPreload() {
  // Settled: ready, failed, gone (a reload removed it), or nothing left that would load it (its
  // load was refused for room).
  std::erase_if(preloading_, [&](uint32_t model) {
    const Model& m = models_[model];
    return m.machine.Is<residency::Ready>() || m.machine.Is<residency::Failed>() ||
           index_->State(model) == shm::ModelState::kEmpty ||
           (m.machine.Is<residency::Absent>() && m.waiters.empty());
  });
  if (ready_sent_ || !preloading_.empty() || stopping_) return;
  ready_sent_ = true;
  // Counted over the preload list only: models adopted across a restart are ready too, and are
  // told apart (a count over every model said "3 of 2").
  uint32_t ready = 0, listed = 0;
  for (const std::string& name : config_.preload) {
    const uint32_t model = index_->Find(name);
    listed++;
    ready += model != shm::kNil && models_[model].machine.Is<residency::Ready>();
  }
  if (listed != 0) {
    Log(LogLevel::kInfo, "preload complete: {} of {} preloaded model(s) ready{}", ready, listed,
        adopted_ != 0 ? fmt::format(" ({} adopted across the restart)", adopted_) : std::string());
  }
  actions_.push_back(action::Notify{action::Notify::Kind::kReady, StatusLine()});
}

std::string Core::StatusLine() const {
  uint32_t ready = 0, loading = 0, parked = 0, failed = 0, registered = 0;
  for (uint32_t model : index_->All()) {
    registered++;
    switch (index_->State(model)) {
      case shm::ModelState::kReady: ready++; break;
      case shm::ModelState::kLoading: loading++; break;
      case shm::ModelState::kParked: parked++; break;
      case shm::ModelState::kFailed: failed++; break;
      default: break;
    }
  }
  uint32_t up = 0;
  for (const WorkerSlot& w : workers_) up += w.state == WorkerSlot::State::kUp;
  std::string line = fmt::format("{} models: {} ready, {} loading, {} parked, {} failed; workers "
                                 "{}/{} up; {} requests open",
                                 registered, ready, loading, parked, failed, up, workers_.size(),
                                 unanswered_);
  return stopping_ ? "stopping: " + line : line;
}

void Core::BeginStop(bool handed_over) {
  handed_over_ = handed_over_ || handed_over;
  if (stopping_) {
    // The drain after a takeover, behind a SIGTERM that started it already: not a second signal.
    if (handed_over) return;
    // A second signal: the operator does not want to wait for the drain.
    if (!drain_ended_) EndDrain("a second stop signal");
    return;
  }
  stopping_ = true;
  Log(LogLevel::kInfo, "stopping: no new requests; {} accepted ones get up to {} ms to finish",
      unanswered_, config_.drain_timeout_ms);
  actions_.push_back(action::Notify{action::Notify::Kind::kStopping, StatusLine()});
  actions_.push_back(action::StopAccepting{});
  preloading_.clear();
  drain_deadline_ms_ = MonoMs() + config_.drain_timeout_ms;
}

void Core::CheckDrained() {
  if (stopping_ && !drain_ended_ && unanswered_ == 0) EndDrain("every request answered");
}

void Core::EndDrain(const std::string& why) {
  drain_ended_ = true;
  uint64_t left = unanswered_;
  Log(LogLevel::kInfo, "drain ended by {}{}; stopping workers", why,
      left == 0 ? std::string() : fmt::format(" ({} requests answered UNAVAILABLE)", left));
  // Every accepted request is answered, even now; then the sessions close (flushing what they can).
  FailEverything(Error(Code::kUnavailable, "warmpoold is stopping; retry once it is back"));
  actions_.push_back(action::CloseSessions{});
  for (auto& [id, session] : sessions_) {
    for (auto& [region_id, region] : session.regions) Close(region.handle);  // the workers stop next
  }
  sessions_.clear();
  regions_ = 0;
  unanswered_ = 0;
  held_bytes_ = 0;
  actions_.push_back(action::StopWorkers{config_.stop_kill_ms});
}

}  // namespace warmpool::supervisor
