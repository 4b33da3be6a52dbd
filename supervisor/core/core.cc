#include "supervisor/core/core.h"

#include <algorithm>

#include "common/units.h"
#include "ipc/framing.h"

namespace warmpool::supervisor {

using shm::ModelState;

Core::Core(Config config, shm::SegmentView segment) : config_(std::move(config)) {
  limits_.capacity = config_.capacity;
  index_ = std::make_unique<shm::ModelIndex>(segment);
  index_->SetParkBudget(config_.park_budget_bytes);
  if (config_.single_active) limits_.capacity = 1;  // switching releases (parks) the active one
  runtime_.resize(config_.max_models);
  workers_.resize(config_.workers_per_device);
}

Core::~Core() = default;

std::vector<Action> Core::Start(std::vector<ModelEntry> entries, std::vector<std::string> warnings,
                                Time now) {
  now_ = now;
  RegisterModels(entries);
  for (const std::string& w : warnings) Log(LogLevel::kWarn, "{}", w);
  Preload();
  next_status_ms_ = MonoMs() + kStatusPeriodMs;
  CheckPreload();
  return std::move(actions_);
}

std::vector<Action> Core::Handle(Event event, Time now) {
  now_ = now;
  std::visit(
      [&](auto&& e) {
        using E = std::decay_t<decltype(e)>;
        if constexpr (std::is_same_v<E, event::ClientRequest>) {
          OnRequest(std::move(e));
        } else if constexpr (std::is_same_v<E, event::ClientGone>) {
          auto it = sessions_.find(e.session);
          if (it != sessions_.end()) {
            unanswered_ -= it->second;  // nobody is left to answer
            sessions_.erase(it);
          }
          CheckDrained();
        } else if constexpr (std::is_same_v<E, event::WorkerUp>) {
          OnWorkerUp(e);
        } else if constexpr (std::is_same_v<E, event::WorkerMessage>) {
          OnWorkerMessage(std::move(e));
        } else if constexpr (std::is_same_v<E, event::WorkerDown>) {
          OnWorkerDown(e);
        } else if constexpr (std::is_same_v<E, event::Tick>) {
          OnTick();
        } else if constexpr (std::is_same_v<E, event::Reload>) {
          Reload(std::move(e));
        } else if constexpr (std::is_same_v<E, event::ModelInspected>) {
          OnModelInspected(e);
        } else if constexpr (std::is_same_v<E, event::Stop>) {
          BeginStop();
        } else if constexpr (std::is_same_v<E, event::WorkersStopped>) {
          stopped_ = true;
        }
      },
      std::move(event));
  return std::move(actions_);
}

void Core::SendToWorker(uint32_t slot, const v1::WorkerEnvelope& message, std::vector<int> handles) {
  actions_.push_back(action::SendToWorker{slot, ipc::Frame(message), std::move(handles)});
}

void Core::CloseHandle(int handle) {
  if (handle >= 0) actions_.push_back(action::CloseHandle{handle});
}

std::vector<std::pair<uint32_t, int>> Core::HeldHandles() const {
  std::vector<std::pair<uint32_t, int>> held;
  for (uint32_t model = 0; model < runtime_.size(); model++) {
    if (runtime_[model].weights_fd >= 0) held.emplace_back(model, runtime_[model].weights_fd);
    if (runtime_[model].park_fd >= 0) held.emplace_back(model, runtime_[model].park_fd);
  }
  return held;
}

void Core::OnWorkerUp(const event::WorkerUp& up) {
  WorkerSlot& w = workers_[up.slot];
  w.ready = true;
  w.generation = up.generation;
  SendFaults(up.slot);  // before any job, so that a respawned worker is armed like the others
  RetryPending();
  for (uint32_t model : index_->All()) GrowReplicas(model);
}

void Core::OnTick() {
  SweepDeadlines();
  if (stopping_ && !drain_ended_ && MonoMs() >= drain_deadline_ms_) EndDrain("the drain timeout");
  if (drain_ended_ || MonoMs() < next_status_ms_) return;
  next_status_ms_ = MonoMs() + kStatusPeriodMs;
  OnStatusTick();
}

bool Core::RegisterModel(const ModelEntry& m) {
  Result<uint32_t> index = index_->Register(m.name, m.engine, m.path, m.weight_bytes);
  if (!index.ok()) {
    Log(LogLevel::kWarn, "model \"{}\" not registered: {}", m.name, index.status().ToString());
    return false;
  }
  ModelRuntime& rt = runtime_[*index];
  rt.workspace_bytes = m.workspace_bytes;
  rt.header = m.header;
  rt.file_size = m.file_size;
  rt.in_features = m.in_features;
  rt.out_features = m.out_features;
  rt.keep_alive_ms = config_.keep_alive_ms;
  rt.target_replicas = 1;
  rt.last_error.clear();
  rt.failed_until_ms = 0;
  rt.crash_ms.clear();
  rt.cooldown_ms = 0;
  rt.registration_problem = m.problem.message();
  rt.refused = !m.path_refused ? OkStatus()
                              : Error(Code::kFailedPrecondition,
                                      "model \"{}\" cannot be loaded: {} (fix it, then reload: "
                                      "systemctl reload warmpool, or SIGHUP)",
                                      m.name, m.problem.message());
  for (const ModelConfig& c : config_.models) {
    if (c.name != m.name) continue;
    if (c.keep_alive_ms != kKeepAliveDefault) rt.keep_alive_ms = c.keep_alive_ms;
    rt.target_replicas = std::max<uint32_t>(1, c.replicas);
  }
  if (!m.problem.ok()) {
    Log(LogLevel::kWarn, "model \"{}\" registered as failed: {}", m.name, m.problem.ToString());
    index_->MarkNotResident(*index, shm::ModelState::kFailed, m.problem.message());
    rt.last_error = m.problem.message();
  }
  return true;
}

void Core::RegisterModels(const std::vector<ModelEntry>& entries) {
  for (const ModelEntry& m : entries) RegisterModel(m);
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
    Enqueue(model, Waiter{Call{0, 0}, false, {}, 0, 0});
  }
  if (!preloading_.empty()) Log(LogLevel::kInfo, "preloading {} model(s)", preloading_.size());
}

void Core::CheckPreload() {
  // Settled: ready, failed, gone (a reload removed it), or nothing left that would load it (its
  // load was refused for room).
  std::erase_if(preloading_, [&](uint32_t model) {
    ModelState state = index_->State(model);
    return state == ModelState::kReady || state == ModelState::kFailed ||
           state == ModelState::kEmpty ||
           (state == ModelState::kRegistered && runtime_[model].waiters.empty());
  });
  if (ready_sent_ || !preloading_.empty() || stopping_) return;
  ready_sent_ = true;
  uint32_t ready = 0;
  for (uint32_t model : index_->All()) ready += index_->State(model) == ModelState::kReady;
  if (!config_.preload.empty()) {
    Log(LogLevel::kInfo, "preload complete: {} of {} preloaded model(s) ready", ready,
        config_.preload.size());
  }
  actions_.push_back(action::Notify{action::Notify::Kind::kReady, StatusLine()});
}

std::string Core::StatusLine() const {
  uint32_t ready = 0, loading = 0, parked = 0, failed = 0, registered = 0;
  for (uint32_t model : index_->All()) {
    registered++;
    switch (index_->State(model)) {
      case ModelState::kReady: ready++; break;
      case ModelState::kLoading: loading++; break;
      case ModelState::kParked: parked++; break;
      case ModelState::kFailed: failed++; break;
      default: break;
    }
  }
  uint32_t up = 0;
  for (const WorkerSlot& w : workers_) up += w.ready;
  std::string line = fmt::format("{} models: {} ready, {} loading, {} parked, {} failed; workers "
                                 "{}/{} up; {} requests open",
                                 registered, ready, loading, parked, failed, up, workers_.size(),
                                 unanswered_);
  if (stopping_) line = "stopping: " + line;
  return line;
}

void Core::OnStatusTick() {
  CheckPreload();
  for (uint32_t model : index_->All()) {
    // Re-registering or forgetting a retiring model happens here, on a clean stack.
    if (runtime_[model].retiring) MaybeRetire(model);
  }
  if (ready_sent_) actions_.push_back(action::Notify{action::Notify::Kind::kStatus, StatusLine()});
}

void Core::BeginStop() {
  if (stopping_) {
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
  CheckDrained();
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
  sessions_.clear();
  unanswered_ = 0;
  actions_.push_back(action::StopWorkers{config_.stop_kill_ms});
}

}  // namespace warmpool::supervisor
