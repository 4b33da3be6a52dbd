#include "supervisor/daemon.h"

#include <grp.h>
#include <malloc.h>
#include <pwd.h>
#include <signal.h>
#include <unistd.h>

#include <sys/socket.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include <spdlog/spdlog.h>

#include "common/clock.h"
#include "common/units.h"
#include "metrics/prometheus.h"
#include "ipc/descriptors.h"
#include "ipc/error_proto.h"
#include "supervisor/core/request_check.h"
#include "supervisor/model_roots.h"
#include "supervisor/region_check.h"
#include "supervisor/registry.h"

namespace warmpool::supervisor {

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

spdlog::level::level_enum SpdlogLevel(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return spdlog::level::debug;
    case LogLevel::kInfo: return spdlog::level::info;
    case LogLevel::kWarn: return spdlog::level::warn;
    case LogLevel::kError: return spdlog::level::err;
    case LogLevel::kCritical: return spdlog::level::critical;
  }
  return spdlog::level::info;
}

// The first line of the file; the file must not be readable by others (it is a password).
Result<std::string> ReadAdminToken(const std::string& path) {
  struct stat st{};
  if (stat(path.c_str(), &st) != 0) {
    return Error(Code::kFailedPrecondition, "[http] admin_token_file {}: {}", path, std::strerror(errno));
  }
  if ((st.st_mode & 0077) != 0) {
    return Error(Code::kFailedPrecondition,
                 "[http] admin_token_file {} is readable by others: chmod 600 it", path);
  }
  std::ifstream in(path);
  std::string token;
  std::getline(in, token);
  while (!token.empty() && (token.back() == '\r' || token.back() == ' ')) token.pop_back();
  if (token.size() < 16) {
    return Error(Code::kFailedPrecondition,
                 "[http] admin_token_file {} holds a token of {} characters: use at least 16 (e.g. "
                 "head -c 32 /dev/urandom | base64 > FILE)",
                 path, token.size());
  }
  return token;
}

}  // namespace

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
  owners_.reset();
  for (auto& o : owner_states_) o->restart_timer.Close();
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
  Result<std::vector<PassedDescriptor>> passed = PassedDescriptors();
  if (!passed.ok()) return passed.status();
  Result<int> activated = ActivatedSocket(*passed);
  if (!activated.ok()) return activated.status();
  // The descriptor store keeps weights across restarts where the service manager has one
  // (systemd >= 254 says how large in $FDSTORE; older ones say nothing, and are asked anyway).
  const char* fdstore = std::getenv("FDSTORE");
  warm_store_ = std::make_unique<WarmStore>(
      config_.instance, service_->notifying() && (fdstore == nullptr || std::strtoul(fdstore, nullptr, 10) != 0));
  if (fdstore != nullptr && std::strtoul(fdstore, nullptr, 10) != 0 &&
      std::strtoul(fdstore, nullptr, 10) < config_.max_models + 2ul) {
    spdlog::warn("FileDescriptorStoreMax={} is less than [limits] max_models + 2 ({}): some warm "
                 "models will load again after a restart",
                 fdstore, config_.max_models + 2ul);
  }


  // Which backend serves, asked of a probe child (this process never loads the CUDA driver).
  const std::string owner_path = worker_path_.substr(0, worker_path_.rfind('/') + 1) + "warmpool-owner";
  Result<BackendChoice> choice = ChooseBackend(config_.backend, owner_path);
  if (!choice.ok()) return choice.status();
  WorkerPoolOptions pool;
  if (choice->cuda) {
    if (Status s = StartCuda(*choice, owner_path, pool); !s.ok()) return s;
  } else {
    config_.backend = "host";
    config_.devices = {DeviceConfig{"", 0, config_.budget_bytes}};
    spdlog::info("backend host ({})", choice->why);
  }
  std::vector<uint64_t> budgets;
  for (const DeviceConfig& d : config_.devices) budgets.push_back(d.budget_bytes);

  // --takeover: what the running daemon hands over (its listening socket among them) joins what the
  // service manager passed. Late in the start, so that what can fail on its own fails before the
  // running daemon stops serving.
  std::string admin_token;
  if (!config_.http_admin_token_file.empty()) {
    Result<std::string> token = ReadAdminToken(config_.http_admin_token_file);
    if (!token.ok()) return token.status();
    admin_token = *token;
  }
  int taken_socket = -1;
  if (config_.takeover) {
    if (*activated >= 0 || service_->notifying()) {
      return Error(Code::kFailedPrecondition,
                   "--takeover is for a daemon started by hand; under systemd restart the service "
                   "instead (systemctl restart warmpool): the descriptor store keeps models warm");
    }
    Result<std::vector<PassedDescriptor>> handed = TakeOver(config_.socket_path);
    if (!handed.ok()) return handed.status();
    for (PassedDescriptor& d : *handed) {
      if (d.name == kHandedSocketName) taken_socket = d.fd;
      else passed->push_back(d);
    }
    spdlog::info("took over from the daemon on {}: {} descriptors", config_.socket_path, handed->size());
  }
  std::vector<KeptWeights> kept = warm_store_->Receive(*passed, /*device_memfds=*/config_.backend != "cuda");
  // Memory a daemon before this one held may still be mapped by its workers (a takeover drains
  // while this one serves): it is never reused for anything else here (CloseHandle).
  for (const KeptWeights& k : kept) adopted_handles_.insert(k.weights.handle);

  shm::Limits limits{config_.max_models,
                     config_.workers_per_device * static_cast<uint32_t>(budgets.size()),
                     config_.max_inflight};
  Result<shm::SharedSegment> segment =
      shm::SharedSegment::Create(config_.instance, limits, budgets, observer_gid_);
  if (!segment.ok()) return segment.status();
  segment_ = std::move(*segment);
  inflight_ = std::make_unique<shm::InflightTable>(segment_.view());
  core_ = std::make_unique<Core>(config_, segment_.view());
  request_stats_ = std::make_unique<RequestStats>(segment_.view());

  ClientServer::Options server_options;
  server_options.max_frame_bytes = config_.max_frame_bytes;
  server_options.max_connections = config_.max_connections;
  server_options.max_requests_per_connection = config_.max_requests_per_connection;
  server_options.max_unread_reply_bytes = config_.max_unread_reply_bytes;
  server_options.max_unread_reply_bytes_total = config_.max_queued_bytes;
  server_options.idle_timeout_ms = config_.idle_timeout_ms;
  server_options.max_connections_per_peer = config_.max_connections_per_peer;
  server_options.max_requests_per_peer = config_.max_requests_per_peer;
  server_options.max_queued_bytes_per_peer = config_.max_queued_bytes_per_peer;
  server_options.max_unread_reply_bytes_per_peer = config_.max_unread_reply_bytes_per_peer;
  server_options.reserved_connections = config_.reserved_connections;
  server_options.request_read_timeout_ms = config_.request_read_timeout_ms;
  server_options.batcher = batcher_.get();
  server_options.metrics = [this] {
    return metrics::RenderPrometheus(segment_.view(), {kVersion, config_.backend, config_.instance});
  };
  server_options.admin_token = admin_token;
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
  if (taken_socket >= 0) {
    if (Status s = server_->Adopt(taken_socket, /*owns_path=*/true); !s.ok()) return s;
  } else if (*activated >= 0) {
    if (Status s = server_->Adopt(*activated); !s.ok()) return s;
  } else if (Status s = server_->Listen(config_.socket_path, socket_gid_); !s.ok()) {
    return s;
  }
  if (!config_.http_listen.empty()) {
    if (Status s = server_->ListenTcp(config_.http_listen); !s.ok()) return s;
    spdlog::info("HTTP API and /metrics on http://{}{}", config_.http_listen,
                 server_options.admin_token.empty() ? " (reads and infer only)" : " (admin token set)");
  }

  pool.worker_path = worker_path_;
  pool.batcher = batcher_.get();
  pool.instance = config_.instance;
  pool.engine_dir = config_.engine_dir;
  pool.workers_per_device = config_.workers_per_device;
  pool.device_budgets = budgets;
  pool.max_frame_bytes = config_.max_frame_bytes;
  pool.threads = ThreadsPerWorker(config_.threads_per_worker, config_.workers_per_device * budgets.size());
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
  if (owners_ != nullptr) {
    if (Status s = StartOwners(owner_path); !s.ok()) return s;
  }

  std::vector<std::string> warnings;
  roots_ = ModelRoots(EffectiveModelRoots(config_));
  std::vector<ModelEntry> entries = DiscoverModels(config_, roots_, warnings);
  dispatching_ = true;
  Execute(core_->Start(std::move(entries), std::move(warnings), Now(), std::move(kept)));
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
               config_.instance, config_.backend, budget_text, config_.workers_per_device * budgets.size(),
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
    daemon->TrimWhenIdle();
  }, kTickMs, kTickMs);
}

void Daemon::TrimWhenIdle() {
  // After a burst of large requests the heap keeps its high-water mark: glibc returns memory to
  // the kernel only from the top of the heap. Once nothing is open, give back what is free.
  if (core_->unanswered() != 0) {
    busy_since_trim_ = true;
    return;
  }
  uint64_t now = MonotonicMillis();
  if (!busy_since_trim_ || now - last_trim_ms_ < 1000) return;
  busy_since_trim_ = false;
  last_trim_ms_ = now;
  malloc_trim(0);
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
    TrimFreedMemory();
  }
  dispatching_ = false;
}

void Daemon::OfferFreedMemory(uint32_t slot, uint64_t job, uint64_t bytes) {
  if (config_.backend != "host") return;
  // Take before trimming: the core has just counted this job's bytes as used, so under a full
  // budget used + kept passes it — and the kept region that made room (the model this load
  // evicted) is the one to reuse, not the first to go. Once it is taken, the rest is trimmed.
  uint64_t size = 0;
  const int fd = freed_memory_.Take(bytes, &size);
  TrimFreedMemory();
  if (fd < 0) return;
  // A larger region shrinks now, not when the worker gets to the job: its tail is counted nowhere
  // once it has left the cache (the core counts `bytes`).
  if (size > bytes && ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    close(fd);
    return;
  }
  spdlog::info("worker {}: job {} reuses {} of freed memory for {}", slot, job, FormatBytes(size), FormatBytes(bytes));
  v1::WorkerEnvelope offer;
  offer.mutable_offer()->set_job(job);
  offer.mutable_offer()->set_bytes(bytes);
  workers_->SendFrame(slot, ipc::Frame(offer), {fd});
  close(fd);  // the channel sends its own copy (or none, to a worker that is dying)
}

void Daemon::TrimFreedMemory() {
  // The host backend has one device. used + kept never passes the budget: a load the core admits
  // into room that kept memory occupies makes the oldest kept memory go first.
  if (freed_memory_.size() == 0) return;
  const uint64_t used = core_->index().DeviceUsed(0);
  const uint64_t budget = core_->index().DeviceBudget(0);
  ForgetMappings(freed_memory_.TrimTo(budget > used ? budget - used : 0));
}

void Daemon::ForgetMappings(const std::vector<uint64_t>& inodes) {
  if (inodes.empty()) return;
  v1::WorkerEnvelope gone;
  for (uint64_t inode : inodes) gone.mutable_mappings_gone()->add_inodes(inode);
  workers_->SendFrameToAll(ipc::Frame(gone));
}

void Daemon::Execute(std::vector<Action>&& actions) {
  for (Action& a : actions) Execute(a);
}

void Daemon::Execute(Action& a) {
  std::visit(
      [&](auto&& act) {
        using A = std::decay_t<decltype(act)>;
        if constexpr (std::is_same_v<A, action::SendToWorker>) {
          if (!act.model_file.empty() && !OpenModelFile(act)) return;
          if (act.allocates != 0) OfferFreedMemory(act.slot, act.job, act.allocates);
          // A worker that is not ready is dying: its death fails the job.
          workers_->SendFrame(act.slot, std::move(act.frame), act.handles);
          // The channel sends duplicates: the model file opened for this frame is the shell's to
          // close (the other handles are the core's).
          if (!act.model_file.empty()) close(act.handles.front());
        } else if constexpr (std::is_same_v<A, action::SpawnWorker>) {
          int pid = workers_->Spawn(act.slot, act.generation);
          if (pid > 0) pending_.push_back(event::WorkerSpawned{act.slot, act.generation, pid});
        } else if constexpr (std::is_same_v<A, action::Reply>) {
          if (act.envelope.has_status_reply() && act.envelope.status_reply().devices_size() > 0 &&
              config_.backend == "host") {
            // What the shell keeps is the shell's to say.
            v1::DeviceStatus* device = act.envelope.mutable_status_reply()->mutable_devices(0);
            device->set_kept_bytes(freed_memory_.bytes());
            device->set_kept_regions(static_cast<uint32_t>(freed_memory_.size()));
          }
          request_stats_->Answered(act.session, act.envelope, MonotonicNanos());
          server_->Send(act.session, act.envelope);
        } else if constexpr (std::is_same_v<A, action::KillWorker>) {
          workers_->Kill(act.slot, act.reason);
        } else if constexpr (std::is_same_v<A, action::CloseHandle>) {
          CloseHandle(act.handle, act.reusable);
        } else if constexpr (std::is_same_v<A, action::InspectModel>) {
          pending_.push_back(Inspect(act));
        } else if constexpr (std::is_same_v<A, action::Notify>) {
          switch (act.kind) {
            case action::Notify::Kind::kReady: service_->Ready(act.status); break;
            case action::Notify::Kind::kReloading: service_->Reloading(); break;
            case action::Notify::Kind::kStopping: service_->Stopping(act.status); break;
            case action::Notify::Kind::kStatus: service_->Status(act.status); break;
          }
        } else if constexpr (std::is_same_v<A, action::Log>) {
          spdlog::log(SpdlogLevel(act.level), "{}", act.text);
        } else if constexpr (std::is_same_v<A, action::StopAccepting>) {
          server_->StopAccepting();
        } else if constexpr (std::is_same_v<A, action::CloseSessions>) {
          server_->Close();
        } else if constexpr (std::is_same_v<A, action::StoreKept>) {
          warm_store_->Sync(act.kept);
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

bool Daemon::IsAdmin(const Peer& peer) const {
  if (peer.tcp) return peer.admin_token;  // no credentials over TCP: only the token
  if (peer.uid == 0 || peer.uid == geteuid()) return true;
  if (!admin_gid_) return false;
  if (peer.gid == *admin_gid_) return true;
  // Supplementary groups of the peer's user.
  passwd pw{};
  passwd* found = nullptr;
  char buffer[4096];
  if (getpwuid_r(peer.uid, &pw, buffer, sizeof(buffer), &found) != 0 || found == nullptr) return false;
  int count = 64;
  std::vector<gid_t> groups(count);
  if (getgrouplist(pw.pw_name, pw.pw_gid, groups.data(), &count) < 0) {
    groups.resize(count);
    if (getgrouplist(pw.pw_name, pw.pw_gid, groups.data(), &count) < 0) return false;
  }
  groups.resize(count);
  return std::find(groups.begin(), groups.end(), *admin_gid_) != groups.end();
}

void Daemon::OnRequest(uint64_t session, const Peer& peer, v1::Envelope&& request, int fd) {
  if (request.has_takeover()) return OnTakeover(session, peer, request.request_id(), fd);
  event::ClientRequest e;
  e.session = session;
  e.handle = fd;  // the core keeps it or closes it
  if (fd >= 0) e.handle_check = CheckClientRegion(fd, request.region().bytes());
  e.uid = peer.uid;
  e.tcp = peer.tcp;
  e.admin = IsAdminRequest(request) && IsAdmin(peer);
  // Only an admin's well-formed register request makes the daemon look at a file.
  if (e.admin && request.has_register_model() && !request.register_model().remove() &&
      CheckRequest(request).ok()) {
    e.registration = LookAtRegistration(request.register_model());
  }
  request_stats_->Received(session, request, core_->index(), MonotonicNanos());
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
  int type = 0;
  socklen_t len = sizeof(type);
  if (peer.tcp || !IsAdmin(peer)) {
    return refuse(Error(Code::kPermissionDenied, "a takeover needs root, the daemon's user or a member of [access] admin_group"));
  }
  if (channel < 0 || getsockopt(channel, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_SEQPACKET) {
    return refuse(Error(Code::kInvalidArgument, "a takeover request carries one end of a SOCK_SEQPACKET socketpair"));
  }
  if (handed_over_ || core_->stopping()) return refuse(Error(Code::kUnavailable, "this daemon is stopping"));
  if (activated_ || service_->notifying()) {
    return refuse(Error(Code::kFailedPrecondition,
                        "this daemon runs under a service manager: restart the service instead "
                        "(systemctl restart warmpool); its descriptor store keeps models warm"));
  }
  const int listener = server_->HandOverListener();
  if (listener < 0) return refuse(Error(Code::kUnavailable, "this daemon is not accepting connections"));
  // From here on no memory this daemon lets go of is reused: the new daemon maps the same regions.
  handed_over_ = true;
  ForgetMappings(freed_memory_.TrimTo(0));
  const std::vector<KeptWeights> kept = core_->Kept();
  // The segment's name goes before the last message: the new daemon creates its own under it.
  bool name_gone = false;
  Status sent = HandOver(channel, listener, kept, config_.instance, [&] {
    segment_.Remove();
    name_gone = true;
  });
  if (!sent.ok() && !name_gone) {
    // The new daemon went away before it had everything: it gives up, this one goes on serving.
    handed_over_ = false;
    return refuse(Error(Code::kUnavailable, "the takeover failed: {}", sent.message()));
  }
  close(channel);
  if (!sent.ok()) {
    spdlog::error("takeover failed at its last step, stopping: {}", sent.ToString());
  } else {
    spdlog::info("handed the socket and {} kept weights to a new warmpoold; draining and stopping",
                 kept.size());
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

Result<ModelEntry> Daemon::LookAtRegistration(const v1::RegisterRequest& request) const {
  ModelEntry entry = InspectModel(request.model(), request.engine(), request.path(), roots_, config_.engine_dir);
  if (entry.path_refused) return entry.problem;  // never registered, not even as failed
  return entry;
}

event::ModelInspected Daemon::Inspect(const action::InspectModel& inspect) const {
  event::ModelInspected e;
  e.model = inspect.model;
  e.path = inspect.path;
  if (!inspect.path.empty()) e.resolved = roots_.Resolve(inspect.path);
  else e.resolved = std::string();
  e.entry = InspectModel(inspect.name, inspect.engine, inspect.path, roots_, config_.engine_dir);
  return e;
}

bool Daemon::OpenModelFile(action::SendToWorker& send) {
  Result<ModelFile> file = roots_.OpenResolved(send.model_file);
  if (file.ok()) {
    send.handles.insert(send.handles.begin(), file->Release());
    return true;
  }
  // The load ends here, before the worker hears of it (so no memory is offered to it either):
  // the core learns of it as of any load that failed.
  event::WorkerMessage e;
  e.slot = send.slot;
  v1::WorkerLoadDone* done = e.message.mutable_load_done();
  done->set_job(send.job);
  ipc::SetError(done->mutable_error(), file.status());
  pending_.push_back(std::move(e));  // any other handle of the frame stays the core's
  return false;
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
    roots_ = ModelRoots(EffectiveModelRoots(config_));
  }
  e.entries = DiscoverModels(config_, roots_, e.warnings);
  e.config = config_;
  return e;
}

void Daemon::OnWorkerMessage(uint32_t slot, v1::WorkerEnvelope&& message) {
  // Device memory (cuda) is the shell's business: the core only ever sees the weights' handles.
  if (message.has_allocate()) return OnWorkerAllocate(slot, message.allocate());
  if (message.has_free()) {
    if (std::optional<GrantRelease> r = grants_.Freed(message.free().grant(), slot)) ReleaseGrant(*r);
    return;
  }
  event::WorkerMessage e;
  e.slot = slot;
  // A successful load carries the weights region, a park its host copy (ipc/descriptors.h). The
  // rule covers both directions; from a worker only these two bodies may carry one, so a worker
  // that sends a supervisor's body (an offer) makes this side take nothing: the descriptor it
  // sent stays queued and is closed with the frames that arrived (ipc/connection.h).
  if ((message.has_load_done() || message.has_park_done()) && ipc::DescriptorsCarried(message) > 0) {
    int fd = workers_->TakeFd(slot);
    if (fd >= 0) e.handles.push_back(fd);
    // The weights of a cuda load live in a grant: it is released when the core lets them go.
    if (fd >= 0 && message.has_load_done() && message.load_done().grant() != 0 &&
        !grants_.Kept(message.load_done().grant(), slot, fd)) {
      spdlog::warn("worker {} named grant {} for its weights, which it was not given", slot,
                   message.load_done().grant());
    }
  }
  e.message = std::move(message);
  Dispatch(std::move(e));
}

void Daemon::OnWorkerDeath(uint32_t slot, uint32_t generation, const std::string& why,
                           int exit_code, bool fatal) {
  for (const GrantRelease& r : grants_.WorkerGone(slot, generation)) ReleaseGrant(r);
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
  if (owners_ != nullptr) owners_->Shutdown();
  for (auto& o : owner_states_) {
    if (o->restart_timer.active()) uv_timer_stop(o->restart_timer.get());
  }
  uv_signal_stop(sigterm_.get());
  uv_signal_stop(sigint_.get());
  uv_signal_stop(sighup_.get());
  service_->Close();
  spdlog::info("stopped");
  uv_stop(&loop_);
}

}  // namespace warmpool::supervisor
