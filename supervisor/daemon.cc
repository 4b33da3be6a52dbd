#include "supervisor/daemon.h"

#include <signal.h>
#include <unistd.h>

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include <spdlog/spdlog.h>

#include "common/clock.h"
#include "common/units.h"
#include "metrics/prometheus.h"
#include "ipc/descriptors.h"
#include "ipc/error_proto.h"
#include "supervisor/boot.h"
#include "supervisor/takeover.h"
#include "supervisor/core/request_check.h"
#include "supervisor/region_check.h"

namespace warmpool::supervisor {

Daemon::Daemon(Config config, std::string worker_path, ConfigLoader reload_config)
    : config_(std::move(config)),
      worker_path_(std::move(worker_path)),
      reload_config_(std::move(reload_config)) {
  uv_loop_init(&loop_);
  batcher_ = std::make_unique<ipc::WriteBatcher>(&loop_);
}

Daemon::~Daemon() {
  // The handles the core still holds die with the process; nothing else needs them.
  server_.reset();
  workers_.reset();
  devices_.reset();
  service_.reset();
  tick_timer_.Close();
  handover_timer_.Close();
  sigterm_.Close();
  sigint_.Close();
  sighup_.Close();
  batcher_.reset();  // after every connection that writes through it
  // Let every close callback run before the loop goes away.
  uv_run(&loop_, UV_RUN_DEFAULT);
  uv_loop_close(&loop_);
}

Time Daemon::Now() const { return Time{MonotonicMillis(), UnixNanos()}; }

Status Daemon::Start() {
  Result<BootPlan> plan = CheckBoot(config_, worker_path_);
  if (!plan.ok()) return plan.status();
  plan_ = std::move(*plan);
  access_ = Access(plan_.admin_gid);
  service_ = std::make_unique<ServiceManager>(&loop_);
  // Before anything else can fail half-way: a bad activation environment is a fatal error.
  Result<std::vector<PassedDescriptor>> passed = PassedDescriptors();
  if (!passed.ok()) return passed.status();
  Result<int> activated = ActivatedSocket(*passed);
  if (!activated.ok()) return activated.status();
  restart_ = std::make_unique<Restart>(config_, service_->notifying());

  Result<std::unique_ptr<DeviceBackend>> devices =
      OpenDeviceBackend(config_, &loop_, plan_.owner_path, [this](Event e) { Dispatch(std::move(e)); });
  if (!devices.ok()) return devices.status();
  devices_ = std::move(*devices);
  std::vector<uint64_t> budgets;
  for (const DeviceConfig& d : config_.devices) budgets.push_back(d.budget_bytes);

  Result<Restart::Received> received = restart_->Receive(*passed, *activated >= 0);
  if (!received.ok()) return received.status();
  const int taken_socket = received->taken_socket;

  shm::Limits limits{config_.max_models,
                     config_.workers_per_device * static_cast<uint32_t>(budgets.size()),
                     config_.max_inflight};
  Result<shm::SharedSegment> segment =
      shm::SharedSegment::Create(config_.instance, limits, budgets, plan_.observer_gid);
  if (!segment.ok()) return segment.status();
  segment_ = std::move(*segment);
  inflight_ = std::make_unique<shm::InflightTable>(segment_.view());
  core_ = std::make_unique<Core>(config_, segment_.view());
  request_stats_ = std::make_unique<RequestStats>(segment_.view());

  ClientServer::Options server_options = ServerOptions(config_, plan_);
  server_options.batcher = batcher_.get();
  server_options.metrics = [this] {
    return metrics::RenderPrometheus(segment_.view(), {kVersion, std::string(BackendName(config_.backend)), config_.instance});
  };
  server_ = std::make_unique<ClientServer>(
      &loop_, server_options,
      [this](uint64_t session, const Peer& peer, v1::Envelope&& request, int fd) {
        OnRequest(session, peer, std::move(request), fd);
      },
      [this](uint64_t session) {
        request_stats_->SessionGone(session);
        Dispatch(event::ClientGone{session});
      });
  activated_ = *activated >= 0;
  if (Status s = server_->Open(taken_socket, *activated, config_.socket_path, plan_.socket_gid, config_.http_listen);
      !s.ok()) {
    return s;
  }

  WorkerPoolOptions pool = PoolOptions(config_, worker_path_, budgets);
  pool.batcher = batcher_.get();
  WorkerEvents events;
  events.on_ready = [this](uint32_t slot) {
    Dispatch(event::WorkerUp{slot, workers_->generation(slot)});
  };
  events.on_message = [this](uint32_t slot, v1::WorkerEnvelope&& m) {
    OnWorkerMessage(slot, std::move(m));
  };
  events.on_death = [this](uint32_t slot, uint32_t generation, const std::string& why,
                           int exit_code, bool fatal) {
    OnWorkerDeath(slot, generation, why, exit_code, fatal);
  };
  workers_ = std::make_unique<WorkerPool>(&loop_, pool, std::move(events));
  if (Status s = devices_->Start(workers_.get()); !s.ok()) return s;

  std::vector<std::string> warnings;
  model_files_.Configure(config_);
  std::vector<ModelEntry> entries = model_files_.Discover(config_, warnings);
  dispatching_ = true;
  Execute(core_->Start(std::move(entries), std::move(warnings), Now(), std::move(received->kept)));
  dispatching_ = false;
  RunPending();

  StartTimers();
  InstallSignals();
  service_->StartWatchdog();

  std::string budget_text;  // per device
  for (uint64_t b : budgets) budget_text += (budget_text.empty() ? "" : " + ") + FormatBytes(b);
  spdlog::info("warmpoold {} serving on {}{} (instance {}, backend {}, budget {}, {} workers of {} "
               "threads, {} models registered{}{})",
               kVersion, server_->path(),
               taken_socket >= 0 ? " (taken over)" : *activated >= 0 ? " (socket activation)" : "",
               config_.instance, BackendName(config_.backend), budget_text, config_.workers_per_device * budgets.size(),
               pool.threads,
               core_->index().All().size(),
               core_->adopted() == 0 ? "" : fmt::format(", {} kept warm across the restart", core_->adopted()),
               config_.enable_fault_injection ? ", FAULT INJECTION ENABLED" : "");
  return OkStatus();
}

void Daemon::StartTimers() {
  uv_timer_init(&loop_, tick_timer_.get());
  tick_timer_.MarkInitialized();
  tick_timer_.get()->data = this;
  uv_timer_start(tick_timer_.get(), [](uv_timer_t* t) {
    auto* daemon = static_cast<Daemon*>(t->data);
    // One turn of libuv's loop runs expired timers, then polls for I/O. After the daemon was
    // stopped (SIGSTOP, a VM stall, swap), this tick runs before anything sent meanwhile has been
    // read: the workers' channels are read here first (their messages reach the core as events
    // ahead of the tick), and the tick tells the core how far the reading goes, so that it judges
    // no worker or request on what it has not read (event::Tick). Clients are read by the next
    // poll: they count as read up to the start of the last poll that completed.
    event::Tick tick;
    tick.clients_read_ms = daemon->workers_->polled_through_ms();
    tick.workers_read_ms = MonotonicMillis();
    daemon->workers_->ReadChannels();
    daemon->Dispatch(tick);
    daemon->heap_trim_.OnTick(daemon->core_->unanswered(), MonotonicMillis());
  }, kTickMs, kTickMs);
}

void Daemon::InstallSignals() {
  for (auto* sig : {&sigterm_, &sigint_, &sighup_}) {
    uv_signal_init(&loop_, sig->get());
    sig->MarkInitialized();
    sig->get()->data = this;
  }
  auto on_stop = [](uv_signal_t* s, int) { static_cast<Daemon*>(s->data)->Dispatch(event::Stop{}); };
  uv_signal_start(sigterm_.get(), on_stop, SIGTERM);
  uv_signal_start(sigint_.get(), on_stop, SIGINT);
  uv_signal_start(sighup_.get(), [](uv_signal_t* s, int) {
    auto* daemon = static_cast<Daemon*>(s->data);
    daemon->Dispatch(daemon->ReadRegistry());
  }, SIGHUP);
}

int Daemon::Run() {
  uv_run(&loop_, UV_RUN_DEFAULT);
  return exit_code_;
}

void Daemon::Dispatch(Event event) {
  pending_.push_back(std::move(event));
  RunPending();
}

void Daemon::RunPending() {
  if (dispatching_) return;  // the loop below takes it after the current batch
  dispatching_ = true;
  while (!pending_.empty()) {
    Event next = std::move(pending_.front());
    pending_.pop_front();
    Execute(core_->Handle(std::move(next), Now()));
  }
  dispatching_ = false;
}

void Daemon::CloseHandle(int fd, bool keep) {
  // Out of the descriptor store before its memory can be reused for anything else: a restart must
  // never adopt a region under a name whose bytes it no longer holds.
  restart_->Forget(fd);
  devices_->Release(fd, keep);
}

void Daemon::Execute(std::vector<Action>&& actions) {
  for (Action& a : actions) Execute(a);
}

void Daemon::Execute(Action& a) {
  std::visit(
      [&](auto&& act) {
        using A = std::decay_t<decltype(act)>;
        if constexpr (std::is_same_v<A, action::SendToWorker>) {
          if (!act.model_file.empty()) {
            if (std::optional<event::WorkerMessage> failed = model_files_.OpenFor(act)) {
              pending_.push_back(std::move(*failed));
              return;
            }
          }
          if (act.offer >= 0) devices_->Offer(act.slot, act.job, act.allocates, act.offer);
          // A worker that is not ready is dying: its death fails the job.
          workers_->SendFrame(act.slot, std::move(act.frame), act.handles);
          // The channel sends duplicates: the model file opened for this frame is the shell's to
          // close (the other handles are the core's).
          if (!act.model_file.empty()) close(act.handles.front());
        } else if constexpr (std::is_same_v<A, action::SpawnWorker>) {
          int pid = workers_->Spawn(act.slot, act.generation);
          if (pid > 0) pending_.push_back(event::WorkerSpawned{act.slot, act.generation, pid});
        } else if constexpr (std::is_same_v<A, action::Reply>) {
          request_stats_->Answered(act.session, act.envelope, MonotonicNanos());
          server_->Send(act.session, act.envelope);
        } else if constexpr (std::is_same_v<A, action::KillWorker>) {
          workers_->Kill(act.slot, act.reason);
        } else if constexpr (std::is_same_v<A, action::CloseHandle>) {
          CloseHandle(act.handle, act.keep);
        } else if constexpr (std::is_same_v<A, action::DropKept>) {
          devices_->DropKept(act.handle);
        } else if constexpr (std::is_same_v<A, action::InspectModel>) {
          pending_.push_back(model_files_.Inspect(act));
        } else if constexpr (std::is_same_v<A, action::Notify>) {
          switch (act.kind) {
            case action::Notify::Kind::kReady: service_->Ready(act.status); break;
            case action::Notify::Kind::kReloading: service_->Reloading(); break;
            case action::Notify::Kind::kStopping: service_->Stopping(act.status); break;
            case action::Notify::Kind::kStatus: service_->Status(act.status); break;
          }
        } else if constexpr (std::is_same_v<A, action::Log>) {
          Log(act.level, act.text);
        } else if constexpr (std::is_same_v<A, action::StopAccepting>) {
          server_->StopAccepting();
        } else if constexpr (std::is_same_v<A, action::CloseSessions>) {
          server_->Close();
        } else if constexpr (std::is_same_v<A, action::StoreKept>) {
          restart_->Store(act.kept);
        } else if constexpr (std::is_same_v<A, action::StopWorkers>) {
          uv_timer_stop(tick_timer_.get());
          workers_->Shutdown(act.kill_after_ms, [this] {
            Dispatch(event::WorkersStopped{});
            FinishStop();
          });
        }
      },
      a);
}

void Daemon::OnRequest(uint64_t session, const Peer& peer, v1::Envelope&& request, int fd) {
  if (request.has_takeover()) return OnTakeover(session, peer, request.request_id(), fd);
  event::ClientRequest e;
  e.session = session;
  e.handle = fd;  // the core keeps it or closes it
  if (fd >= 0) e.handle_check = CheckClientRegion(fd, request.region().bytes());
  e.uid = peer.uid;
  e.tcp = peer.tcp;
  e.admin = IsAdminRequest(request) && access_.IsAdmin(peer);
  // Only an admin's well-formed register request makes the daemon look at a file.
  if (e.admin && request.has_register_model() && !request.register_model().remove() &&
      CheckRequest(request).ok()) {
    e.registration = model_files_.LookAtRegistration(request.register_model());
  }
  request_stats_->Received(
      session, request, [&](const std::string& name) { return core_->Resolve(name); }, MonotonicNanos());
  e.envelope = std::move(request);
  Dispatch(std::move(e));
}

void Daemon::OnTakeover(uint64_t session, const Peer& peer, uint64_t request_id, int channel) {
  v1::Envelope reply;
  reply.set_request_id(request_id);
  auto refuse = [&](const Status& why) {
    if (channel >= 0) close(channel);
    spdlog::warn("takeover refused: {}", why.message());
    ipc::SetError(reply.mutable_error(), why);
    server_->Send(session, reply);
  };
  TakeoverAsk ask;
  ask.tcp = peer.tcp;
  ask.admin = access_.IsAdmin(peer);
  ask.seqpacket_channel = IsSeqpacketSocket(channel);
  ask.stopping = restart_->handed_over() || core_->stopping();
  ask.under_service_manager = activated_ || service_->notifying();
  const int listener = server_->HandOverListener();
  ask.accepting = listener >= 0;
  if (Status s = CheckTakeover(ask); !s.ok()) return refuse(s);
  // The new daemon maps the same regions: nothing is kept for reuse here from now on.
  Dispatch(event::HandingOver{});
  devices_->HandedOver();
  const std::vector<KeptWeights> kept = core_->Kept();
  Status failed;
  if (!restart_->HandOverTo(channel, listener, kept, [this] { segment_.Remove(); }, &failed)) {
    spdlog::warn("takeover refused: {}", failed.message());
    ipc::SetError(reply.mutable_error(), failed);
    return server_->Send(session, reply);
  }
  if (failed.ok()) {
    server_->ReleasePath();
    server_->StopAccepting();  // now: a connection from here on is the new daemon's
    reply.mutable_takeover_reply()->set_models(static_cast<uint32_t>(kept.size()));
    server_->Send(session, reply);
  }
  // The drain starts on the next turn of the loop, outside this session's frame callback: it may
  // close every session at once (this one among them) when nothing is in flight.
  uv_timer_init(&loop_, handover_timer_.get());
  handover_timer_.MarkInitialized();
  handover_timer_.get()->data = this;
  uv_timer_start(handover_timer_.get(), [](uv_timer_t* t) {
    static_cast<Daemon*>(t->data)->Dispatch(event::Stop{/*handed_over=*/true});
  }, 0, 0);
}

event::Reload Daemon::ReadRegistry() {
  event::Reload e;
  if (reload_config_) {
    Result<Config> read = reload_config_();
    if (!read.ok()) {
      e.config = read.status();
      return e;
    }
    // The shell resolves `register` paths and inspects files under the same roots as the core.
    TakeRegistrySettings(config_, *read);
    model_files_.Configure(config_);
    // The API keys and the admin token too, so that either can be revoked, added or rotated
    // without a restart.
    if (server_ != nullptr) server_->ReloadSecrets(read->http_api_keys_file, read->http_admin_token_file);
  }
  e.entries = model_files_.Discover(config_, e.warnings);
  e.config = config_;
  return e;
}

void Daemon::OnWorkerMessage(uint32_t slot, v1::WorkerEnvelope&& message) {
  // Device memory is the shell's business: the core only ever sees the weights' handles.
  if (devices_->OnWorkerMessage(slot, message)) return;
  event::WorkerMessage e;
  e.slot = slot;
  // A successful load carries the weights region and its engine's KV cache region, a park its
  // host copy (ipc/descriptors.h). The rule covers both directions; from a worker only these two
  // bodies may carry any, so a worker that sends a supervisor's body (an offer) makes this side
  // take nothing: what it sent stays queued and is closed with the frames that arrived
  // (ipc/connection.h).
  if (message.has_load_done() || message.has_park_done()) {
    // In their places, a missing one as -1: the core takes each by its position.
    for (int i = ipc::DescriptorsCarried(message); i > 0; i--) e.handles.push_back(workers_->TakeFd(slot));
    if (message.has_load_done()) {
      const v1::WorkerLoadDone& done = message.load_done();
      const size_t cache_at = done.weights_shared() ? 1 : 0;
      if (done.weights_shared() && e.handles[0] >= 0) devices_->OnKept(slot, done.grant(), e.handles[0], "weights");
      if (done.cache_shared() && e.handles[cache_at] >= 0) {
        devices_->OnKept(slot, done.cache_grant(), e.handles[cache_at], "KV cache");
      }
    }
  }
  e.message = std::move(message);
  Dispatch(std::move(e));
}

void Daemon::OnWorkerDeath(uint32_t slot, uint32_t generation, const std::string& why,
                           int exit_code, bool fatal) {
  devices_->OnWorkerGone(slot, generation);
  event::WorkerDown e;
  e.slot = slot;
  e.generation = generation;
  e.why = why;
  e.exit_text = workers_->LastExit(slot);
  e.exit_code = exit_code;
  e.fatal = fatal;
  // The in-flight markers it still held say what it was doing when it died.
  std::vector<shm::InflightSlot> taken;
  inflight_->Reclaim(static_cast<uint16_t>(slot), generation, &taken);
  for (const shm::InflightSlot& s : taken) e.running_jobs.push_back(s.request_id);
  Dispatch(std::move(e));
}

void Daemon::FinishStop() {
  if (Status s = shm::Validate(segment_.view()); !s.ok()) {
    spdlog::error("segment invariant broken at shutdown: {}", s.ToString());
    exit_code_ = 1;
  }
  segment_.Remove();  // a no-op once handed over: the name is the new daemon's
  devices_->Shutdown();
  uv_signal_stop(sigterm_.get());
  uv_signal_stop(sigint_.get());
  uv_signal_stop(sighup_.get());
  service_->Close();
  spdlog::info("stopped");
  uv_stop(&loop_);
}

}  // namespace warmpool::supervisor
