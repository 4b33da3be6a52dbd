#include "supervisor/daemon.h"

#include <grp.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>

#include <spdlog/spdlog.h>

#include "common/units.h"
#include "supervisor/registry.h"

namespace warmpool::supervisor {

using shm::ModelState;

namespace {

Result<gid_t> LookupGroup(const std::string& name, const std::string& key) {
  group* g = getgrnam(name.c_str());
  if (g == nullptr) {
    return Error(Code::kFailedPrecondition,
                 "[access] {} \"{}\" is not a group on this machine: create it (groupadd {}) or "
                 "fix the name",
                 key, name, name);
  }
  return g->gr_gid;
}

}  // namespace

Daemon::Daemon(Config config, std::string worker_path, ConfigLoader reload_config)
    : config_(std::move(config)),
      worker_path_(std::move(worker_path)),
      reload_config_(std::move(reload_config)) {
  uv_loop_init(&loop_);
  limits_.capacity = config_.capacity;
}

Daemon::~Daemon() {
  for (ModelRuntime& rt : runtime_) {
    if (rt.weights_fd >= 0) close(rt.weights_fd);
    if (rt.park_fd >= 0) close(rt.park_fd);
  }
  server_.reset();
  workers_.reset();
  service_.reset();
  sweep_timer_.Close();
  status_timer_.Close();
  drain_timer_.Close();
  sigterm_.Close();
  sigint_.Close();
  sighup_.Close();
  // Let every close callback run before the loop goes away.
  uv_run(&loop_, UV_RUN_DEFAULT);
  uv_loop_close(&loop_);
}

Status Daemon::Start() {
  if (config_.backend == "cuda") {
    return Error(Code::kFailedPrecondition,
                 "backend \"cuda\" is not available in this build: run with --backend host (or "
                 "auto)");
  }
  for (auto [name, key, gid] : {std::tuple{&config_.admin_group, "admin_group", &admin_gid_},
                                std::tuple{&config_.socket_group, "socket_group", &socket_gid_},
                                std::tuple{&config_.observer_group, "observer_group", &observer_gid_}}) {
    if (name->empty()) continue;
    Result<gid_t> g = LookupGroup(*name, key);
    if (!g.ok()) return g.status();
    *gid = *g;
  }
  service_ = std::make_unique<ServiceManager>(&loop_);
  // Before anything else can fail half-way: a bad activation environment is a fatal error.
  Result<int> activated = ActivatedSocket();
  if (!activated.ok()) return activated.status();

  shm::Limits limits{config_.max_models, config_.workers_per_device, config_.max_inflight};
  Result<shm::SharedSegment> segment = shm::SharedSegment::Create(
      config_.instance, limits, /*device_count=*/1, config_.budget_bytes, observer_gid_);
  if (!segment.ok()) return segment.status();
  segment_ = std::move(*segment);
  index_ = std::make_unique<shm::ModelIndex>(segment_.view());
  inflight_ = std::make_unique<shm::InflightTable>(segment_.view());
  index_->SetParkBudget(config_.park_budget_bytes);
  if (config_.single_active) limits_.capacity = 1;  // switching releases (parks) the active one
  runtime_.resize(config_.max_models);
  worker_models_.assign(config_.workers_per_device, 0);
  worker_outstanding_.assign(config_.workers_per_device, 0);
  worker_pending_bytes_.assign(config_.workers_per_device, 0);
  worker_load_done_ms_.assign(config_.workers_per_device, 0);
  worker_serving_done_ms_.assign(config_.workers_per_device, 0);

  RegisterModels();

  ClientServer::Options server_options;
  server_options.max_frame_bytes = config_.max_frame_bytes;
  server_options.max_connections = config_.max_connections;
  server_options.max_requests_per_connection = config_.max_requests_per_connection;
  server_ = std::make_unique<ClientServer>(
      &loop_, server_options, [this](uint64_t session, const Peer& peer, v1::Envelope&& request) {
        OnRequest(session, peer, std::move(request));
      });
  if (*activated >= 0) {
    if (Status s = server_->Adopt(*activated); !s.ok()) return s;
  } else if (Status s = server_->Listen(config_.socket_path, socket_gid_); !s.ok()) {
    return s;
  }

  WorkerPoolOptions pool;
  pool.worker_path = worker_path_;
  pool.instance = config_.instance;
  pool.engine_dir = config_.engine_dir;
  pool.count = config_.workers_per_device;
  pool.budget_bytes = config_.budget_bytes;
  pool.max_frame_bytes = config_.max_frame_bytes;
  pool.respawn_min_ms = config_.respawn_min_ms;
  pool.respawn_max_ms = config_.respawn_max_ms;
  pool.respawn_stable_ms = config_.respawn_stable_ms;
  WorkerEvents events;
  events.on_ready = [this](uint32_t slot) {
    SendFaults(slot);  // before any job, so that a respawned worker is armed like the others
    RetryPending();
    for (uint32_t model : index_->All()) GrowReplicas(model);
  };
  events.on_message = [this](uint32_t slot, v1::WorkerEnvelope&& m) {
    OnWorkerMessage(slot, std::move(m));
  };
  events.on_death = [this](uint32_t slot, uint32_t generation, const std::string& why) {
    OnWorkerDeath(slot, generation, why);
  };
  workers_ = std::make_unique<WorkerPool>(&loop_, segment_.view(), pool, std::move(events));
  workers_->StartAll();
  Preload();

  StartTimer(sweep_timer_, 50, 50, [](Daemon* d) { d->SweepDeadlines(); });
  InstallSignals();
  service_->StartWatchdog();
  StartTimer(status_timer_, 250, 250, [](Daemon* d) { d->OnStatusTick(); });

  spdlog::info("warmpoold {} serving on {}{} (instance {}, backend host, budget {}, {} workers, {} "
               "models registered{})",
               kVersion, server_->path(), *activated >= 0 ? " (socket activation)" : "",
               config_.instance, FormatBytes(config_.budget_bytes), config_.workers_per_device,
               index_->All().size(),
               config_.enable_fault_injection ? ", FAULT INJECTION ENABLED" : "");
  CheckPreload();
  return OkStatus();
}

void Daemon::StartTimer(ipc::UvHandle<uv_timer_t>& timer, uint64_t first_ms, uint64_t repeat_ms,
                        void (*fire)(Daemon*)) {
  uv_timer_init(&loop_, timer.get());
  timer.MarkInitialized();
  timer.get()->data = this;
  timer_actions_[timer.get()] = fire;
  uv_timer_start(timer.get(), [](uv_timer_t* t) {
    auto* daemon = static_cast<Daemon*>(t->data);
    daemon->timer_actions_.at(t)(daemon);
  }, first_ms, repeat_ms);
}

void Daemon::InstallSignals() {
  for (auto* sig : {&sigterm_, &sigint_, &sighup_}) {
    uv_signal_init(&loop_, sig->get());
    sig->MarkInitialized();
    sig->get()->data = this;
  }
  auto on_stop = [](uv_signal_t* s, int signum) {
    static_cast<Daemon*>(s->data)->BeginStop();
  };
  uv_signal_start(sigterm_.get(), on_stop, SIGTERM);
  uv_signal_start(sigint_.get(), on_stop, SIGINT);
  uv_signal_start(sighup_.get(), [](uv_signal_t* s, int) {
    static_cast<Daemon*>(s->data)->Reload();
  }, SIGHUP);
}

bool Daemon::RegisterModel(const ModelEntry& m) {
  Result<uint32_t> index = index_->Register(m.name, m.engine, m.path, m.weight_bytes);
  if (!index.ok()) {
    spdlog::warn("model \"{}\" not registered: {}", m.name, index.status().ToString());
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
    spdlog::warn("model \"{}\" registered as failed: {}", m.name, m.problem.ToString());
    index_->MarkNotResident(*index, shm::ModelState::kFailed, m.problem.message());
    rt.last_error = m.problem.message();
  }
  return true;
}

void Daemon::RegisterModels() {
  std::vector<std::string> warnings;
  for (const ModelEntry& m : DiscoverModels(config_, warnings)) RegisterModel(m);
  for (const std::string& w : warnings) spdlog::warn("{}", w);
}

void Daemon::Preload() {
  for (const std::string& name : config_.preload) {
    uint32_t model = index_->Find(name);
    if (model == shm::kNil) {
      spdlog::warn("preload: model \"{}\" is not registered; skipped", name);
      continue;
    }
    preloading_.push_back(model);
    // A load with nobody to answer (session 0): it starts as soon as a worker is up.
    Enqueue(model, Waiter{Call{0, 0}, false, {}, 0, 0});
  }
  if (!preloading_.empty()) spdlog::info("preloading {} model(s)", preloading_.size());
}

void Daemon::CheckPreload() {
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
    spdlog::info("preload complete: {} of {} preloaded model(s) ready", ready, config_.preload.size());
  }
  service_->Ready(StatusLine());
}

std::string Daemon::StatusLine() const {
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
  for (uint32_t slot = 0; slot < workers_->size(); slot++) up += workers_->ready(slot);
  std::string line = fmt::format("{} models: {} ready, {} loading, {} parked, {} failed; workers "
                                 "{}/{} up; {} requests open",
                                 registered, ready, loading, parked, failed, up, workers_->size(),
                                 server_->unanswered());
  if (stopping_) line = "stopping: " + line;
  return line;
}

void Daemon::OnStatusTick() {
  CheckPreload();
  for (uint32_t model : index_->All()) {
    // Re-registering or forgetting a retiring model happens here, on a clean stack.
    if (runtime_[model].retiring) MaybeRetire(model);
  }
  if (ready_sent_) service_->Status(StatusLine());
}

int Daemon::Run() {
  uv_run(&loop_, UV_RUN_DEFAULT);
  return exit_code_;
}

void Daemon::BeginStop() {
  if (stopping_) {
    // A second signal: the operator does not want to wait for the drain.
    if (!drain_ended_) EndDrain("a second stop signal");
    return;
  }
  stopping_ = true;
  spdlog::info("stopping: no new requests; {} accepted ones get up to {} ms to finish",
               server_->unanswered(), config_.drain_timeout_ms);
  service_->Stopping(StatusLine());
  server_->StopAccepting();
  preloading_.clear();
  StartTimer(drain_timer_, config_.drain_timeout_ms, 0,
             [](Daemon* d) { d->EndDrain("the drain timeout"); });
  CheckDrained();
}

void Daemon::CheckDrained() {
  if (stopping_ && !drain_ended_ && server_->unanswered() == 0) EndDrain("every request answered");
}

void Daemon::EndDrain(const std::string& why) {
  drain_ended_ = true;
  if (drain_timer_.active()) uv_timer_stop(drain_timer_.get());
  uint64_t left = server_->unanswered();
  spdlog::info("drain ended by {}{}; stopping workers", why,
               left == 0 ? std::string() : fmt::format(" ({} requests answered UNAVAILABLE)", left));
  // Every accepted request is answered, even now; then the sessions close (flushing what they can).
  FailEverything(Error(Code::kUnavailable, "warmpoold is stopping; retry once it is back"));
  server_->Close();
  uv_timer_stop(sweep_timer_.get());
  uv_timer_stop(status_timer_.get());
  workers_->Shutdown(config_.stop_kill_ms, [this] { FinishStop(); });
}

void Daemon::FinishStop() {
  if (Status s = shm::Validate(segment_.view()); !s.ok()) {
    spdlog::error("segment invariant broken at shutdown: {}", s.ToString());
    exit_code_ = 1;
  }
  segment_.Remove();
  uv_signal_stop(sigterm_.get());
  uv_signal_stop(sigint_.get());
  uv_signal_stop(sighup_.get());
  service_->Close();
  spdlog::info("stopped");
  uv_stop(&loop_);
}

}  // namespace warmpool::supervisor
