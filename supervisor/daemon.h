// warmpoold's shell: one thread, one libuv loop. It owns what the core must not touch (the loop,
// the client socket, the worker processes, the segment's mapping, systemd, the file system) and
// does two things: it turns what happens into events for the core (supervisor/core/core.h), and it
// carries out the actions the core returns, in order.
//
// Events that arise while actions are carried out (a connection that closes as a reply is queued,
// a worker found dead while a frame is written) are queued and handed to the core after the
// current batch: the core always runs to completion on one event.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <set>
#include <unordered_map>

#include <uv.h>

#include "common/status.h"
#include "ipc/uv_handle.h"
#include "shm/inflight.h"
#include "shm/segment.h"
#include "supervisor/client_server.h"
#include "supervisor/config.h"
#include "supervisor/core/core.h"
#include "supervisor/device_owners.h"
#include "supervisor/device_probe.h"
#include "supervisor/grants.h"
#include "supervisor/model_roots.h"
#include "supervisor/region_cache.h"
#include "supervisor/request_stats.h"
#include "supervisor/service_manager.h"
#include "supervisor/takeover.h"
#include "supervisor/warm_store.h"
#include "supervisor/worker_pool.h"

namespace warmpool::supervisor {

class Daemon {
 public:
  // Reads the configuration again (file, then flags) for SIGHUP.
  using ConfigLoader = std::function<Result<Config>()>;
  Daemon(Config config, std::string worker_path, ConfigLoader reload_config = nullptr);
  ~Daemon();

  // Creates the segment, registers models, starts workers and listens. Errors are fatal.
  Status Start();
  // Runs the loop until SIGTERM/SIGINT and a clean stop. Returns the exit code.
  int Run();

 private:
  void Dispatch(Event event);
  void RunPending();
  void Execute(std::vector<Action>&& actions);
  void Execute(Action& action);
  Time Now() const;
  // Root, the daemon's own user, or a member of [access] admin_group.
  bool IsAdmin(const Peer& peer) const;
  void OnRequest(uint64_t session, const Peer& peer, v1::Envelope&& request, int fd);
  // `warmpoold --takeover` asks for everything (supervisor/takeover.h); `channel` came with it.
  void OnTakeover(uint64_t session, const Peer& peer, uint64_t request_id, int channel);
  // `warmpool register`: where the path leads and what its header says.
  Result<ModelEntry> LookAtRegistration(const v1::RegisterRequest& request) const;
  // A load's model file, opened beneath its root and put first among the frame's descriptors;
  // false (and the load's failure queued for the core) when it cannot be opened.
  bool OpenModelFile(action::SendToWorker& send);
  event::ModelInspected Inspect(const action::InspectModel& inspect) const;
  event::Reload ReadRegistry();
  void OnWorkerMessage(uint32_t slot, v1::WorkerEnvelope&& message);
  // cuda: the devices, their budgets and how memory is shared; one owner per device.
  Status StartCuda(const BackendChoice& choice, const std::string& owner_path, WorkerPoolOptions& pool);
  Status StartOwners(const std::string& owner_path);
  // cuda: a worker asks for device memory; its device's owner answers; grants are released.
  void OnWorkerAllocate(uint32_t slot, const v1::WorkerAllocate& request);
  void OnOwnerAllocated(uint32_t device, const v1::OwnerAllocated& allocated, int fd);
  void OnOwnerDeath(uint32_t device, const std::string& why, bool fatal);
  void RestartOwner(uint32_t device);
  void ReleaseGrant(const GrantRelease& release);
  // A handle the core let go of: a cuda grant is released; on the host backend the memory is kept
  // for reuse (supervisor/region_cache.h).
  void CloseHandle(int fd, bool reusable);
  // Host backend: hands the worker kept memory for a job that allocates; trims what is kept to
  // the room the budget leaves (after every batch of actions).
  void OfferFreedMemory(uint32_t slot, uint64_t job, uint64_t bytes);
  // Host backend: memory closed (by inode) that workers may still keep mapped: they unmap it.
  void ForgetMappings(const std::vector<uint64_t>& inodes);
  void TrimFreedMemory();
  void OnWorkerDeath(uint32_t slot, uint32_t generation, const std::string& why, int exit_code,
                     bool fatal);
  void InstallSignals();
  void StartTimers();
  void TrimWhenIdle();
  void FinishStop();

  Config config_;
  ModelRoots roots_;  // the model roots as descriptors: every model file is opened beneath one
  std::string worker_path_;
  ConfigLoader reload_config_;
  uv_loop_t loop_{};
  shm::SharedSegment segment_;
  std::unique_ptr<shm::InflightTable> inflight_;
  std::unique_ptr<Core> core_;
  std::unique_ptr<RequestStats> request_stats_;
  std::unique_ptr<ipc::WriteBatcher> batcher_;  // declared before what writes through it
  std::unique_ptr<WorkerPool> workers_;
  std::unique_ptr<DeviceOwners> owners_;     // cuda only
  GrantTable grants_;                        // cuda only
  RegionCache freed_memory_;                 // host only
  // cuda: what the shell keeps of each device's owner (index = device = CUDA ordinal).
  struct OwnerState {
    Daemon* daemon = nullptr;
    uint32_t device = 0;
    ipc::UvHandle<uv_timer_t> restart_timer;
    uint64_t started_ms = 0;
    uint64_t restart_delay_ms = 0;
    bool fatal = false;  // exited with status 2: not started again
    std::vector<v1::OwnerEnvelope> waiting;  // allocations asked while it restarts
  };
  std::vector<std::unique_ptr<OwnerState>> owner_states_;
  void ScheduleOwnerRestart(OwnerState& owner);
  std::unique_ptr<ClientServer> server_;
  std::unique_ptr<ServiceManager> service_;
  std::unique_ptr<WarmStore> warm_store_;
  bool activated_ = false;    // serving a socket the service manager passed
  std::set<int> adopted_handles_;  // handles kept by a daemon before this one, while the core holds them
  bool handed_over_ = false;  // a new daemon took over: its segment and socket are not ours
  std::optional<gid_t> admin_gid_;
  std::optional<gid_t> socket_gid_;
  std::optional<gid_t> observer_gid_;

  std::deque<Event> pending_;
  bool dispatching_ = false;
  bool busy_since_trim_ = false;
  uint64_t last_trim_ms_ = 0;
  int exit_code_ = 0;

  ipc::UvHandle<uv_timer_t> tick_timer_;
  ipc::UvHandle<uv_timer_t> handover_timer_;  // the drain after a takeover, on the next turn
  ipc::UvHandle<uv_signal_t> sigterm_;
  ipc::UvHandle<uv_signal_t> sigint_;
  ipc::UvHandle<uv_signal_t> sighup_;
};

}  // namespace warmpool::supervisor
