#include "supervisor/daemon.h"

#include <grp.h>
#include <signal.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include "common/units.h"
#include "supervisor/registry.h"

namespace warmpool::supervisor {

Daemon::Daemon(Config config, std::string worker_path)
    : config_(std::move(config)), worker_path_(std::move(worker_path)) {
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
  sweep_timer_.Close();
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
  if (!config_.admin_group.empty()) {
    group* g = getgrnam(config_.admin_group.c_str());
    if (g == nullptr) {
      return Error(Code::kFailedPrecondition,
                   "[access] admin_group \"{}\" is not a group on this machine: create it "
                   "(groupadd {}) or fix the name",
                   config_.admin_group, config_.admin_group);
    }
    admin_gid_ = g->gr_gid;
  }
  shm::Limits limits{config_.max_models, config_.workers_per_device, config_.max_inflight};
  Result<shm::SharedSegment> segment =
      shm::SharedSegment::Create(config_.instance, limits, /*device_count=*/1, config_.budget_bytes);
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

  server_ = std::make_unique<ClientServer>(
      &loop_, config_.max_frame_bytes, config_.max_connections,
      [this](uint64_t session, const Peer& peer, v1::Envelope&& request) {
        OnRequest(session, peer, std::move(request));
      });
  if (Status s = server_->Listen(config_.socket_path); !s.ok()) return s;

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

  uv_timer_init(&loop_, sweep_timer_.get());
  sweep_timer_.MarkInitialized();
  sweep_timer_.get()->data = this;
  uv_timer_start(sweep_timer_.get(), [](uv_timer_t* t) {
    static_cast<Daemon*>(t->data)->SweepDeadlines();
  }, 50, 50);
  for (auto* sig : {&sigterm_, &sigint_, &sighup_}) {
    uv_signal_init(&loop_, sig->get());
    sig->MarkInitialized();
    sig->get()->data = this;
  }
  auto on_signal = [](uv_signal_t* s, int signum) {
    spdlog::info("received signal {}; stopping", signum);
    static_cast<Daemon*>(s->data)->BeginStop();
  };
  uv_signal_start(sigterm_.get(), on_signal, SIGTERM);
  uv_signal_start(sigint_.get(), on_signal, SIGINT);
  uv_signal_start(sighup_.get(), [](uv_signal_t*, int) {
    spdlog::warn("SIGHUP: reloading the registry is not supported yet; restart warmpoold to pick up "
                 "new models");
  }, SIGHUP);

  spdlog::info("warmpoold {} serving on {} (instance {}, backend host, budget {}, {} workers, {} "
               "models registered{})",
               kVersion, config_.socket_path, config_.instance, FormatBytes(config_.budget_bytes),
               config_.workers_per_device, index_->All().size(),
               config_.enable_fault_injection ? ", FAULT INJECTION ENABLED" : "");
  return OkStatus();
}

void Daemon::RegisterModels() {
  std::vector<std::string> warnings;
  for (const ModelEntry& m : DiscoverModels(config_, warnings)) {
    Result<uint32_t> index = index_->Register(m.name, m.engine, m.path, m.weight_bytes);
    if (!index.ok()) {
      spdlog::warn("model \"{}\" not registered: {}", m.name, index.status().ToString());
      continue;
    }
    runtime_[*index].workspace_bytes = m.workspace_bytes;
    runtime_[*index].header = m.header;
    runtime_[*index].keep_alive_ms = config_.keep_alive_ms;
    for (const ModelConfig& c : config_.models) {
      if (c.name != m.name) continue;
      if (c.keep_alive_ms != kKeepAliveDefault) runtime_[*index].keep_alive_ms = c.keep_alive_ms;
      runtime_[*index].target_replicas = std::max<uint32_t>(1, c.replicas);
    }
    runtime_[*index].file_size = m.file_size;
    runtime_[*index].in_features = m.in_features;
    runtime_[*index].out_features = m.out_features;
    if (!m.problem.ok()) {
      spdlog::warn("model \"{}\" registered as failed: {}", m.name, m.problem.ToString());
      index_->MarkNotResident(*index, shm::ModelState::kFailed, m.problem.message());
      runtime_[*index].last_error = m.problem.message();
    }
  }
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

int Daemon::Run() {
  uv_run(&loop_, UV_RUN_DEFAULT);
  return exit_code_;
}

void Daemon::BeginStop() {
  if (stopping_) return;
  stopping_ = true;
  // Every accepted request is answered, even now; then the sessions close (flushing what they can).
  FailEverything(Error(Code::kUnavailable, "warmpoold is stopping; retry once it is back"));
  server_->Close();
  uv_timer_stop(sweep_timer_.get());
  workers_->Shutdown(/*grace_ms=*/3000, [this] { FinishStop(); });
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
  spdlog::info("stopped");
  uv_stop(&loop_);
}

}  // namespace warmpool::supervisor
