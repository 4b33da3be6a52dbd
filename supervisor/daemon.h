// warmpoold's shell: one thread, one libuv loop. It owns what the core must not touch (the loop,
// the client socket, the worker processes, the segment's mapping, systemd, the file system) and
// does two things: it turns what happens into events for the core (supervisor/core/core.h), and it
// carries out the actions the core returns, in order.
//
// Events that arise while actions are carried out (a connection that closes as a reply is queued,
// a worker found dead while a frame is written) are queued and handed to the core after the
// current batch: the core always runs to completion on one event.
#pragma once


#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>

#include <uv.h>

#include "common/status.h"
#include "ipc/uv_handle.h"
#include "shm/inflight.h"
#include "shm/segment.h"
#include "supervisor/access.h"
#include "supervisor/boot.h"
#include "supervisor/client_server.h"
#include "supervisor/config.h"
#include "supervisor/core/core.h"
#include "supervisor/device_backend.h"
#include "supervisor/heap_trim.h"
#include "supervisor/model_files.h"
#include "supervisor/request_stats.h"
#include "supervisor/restart.h"
#include "supervisor/service_manager.h"
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
  void OnRequest(uint64_t session, const Peer& peer, v1::Envelope&& request, int fd);
  // `warmpoold --takeover` asks for everything (supervisor/takeover.h); `channel` came with it.
  void OnTakeover(uint64_t session, const Peer& peer, uint64_t request_id, int channel);
  event::Reload ReadRegistry();
  void OnWorkerMessage(uint32_t slot, v1::WorkerEnvelope&& message);
  // A handle the core let go of: out of the store, then the device backend's.
  void CloseHandle(int fd, bool keep);
  void OnWorkerDeath(uint32_t slot, uint32_t generation, const std::string& why, int exit_code,
                     bool fatal);
  void InstallSignals();
  void StartTimers();
  void FinishStop();

  Config config_;
  ModelFiles model_files_;  // every read and open of a model file (supervisor/model_files.h)
  std::string worker_path_;
  ConfigLoader reload_config_;
  uv_loop_t loop_{};
  shm::SharedSegment segment_;
  std::unique_ptr<shm::InflightTable> inflight_;
  std::unique_ptr<Core> core_;
  std::unique_ptr<RequestStats> request_stats_;
  std::unique_ptr<ipc::WriteBatcher> batcher_;  // declared before what writes through it
  std::unique_ptr<WorkerPool> workers_;
  // Device memory: host or cuda (supervisor/device_backend.h); after the workers, whose pool
  // it sends through.
  std::unique_ptr<DeviceBackend> devices_;
  std::unique_ptr<ClientServer> server_;
  std::unique_ptr<ServiceManager> service_;
  std::unique_ptr<Restart> restart_;  // the store and takeovers (supervisor/restart.h)
  bool activated_ = false;    // serving a socket the service manager passed
  BootPlan plan_;   // what the start-up checks found (supervisor/boot.h)
  Access access_;   // who is an admin

  std::deque<Event> pending_;
  bool dispatching_ = false;
  HeapTrim heap_trim_;
  int exit_code_ = 0;

  ipc::UvHandle<uv_timer_t> tick_timer_;
  ipc::UvHandle<uv_timer_t> handover_timer_;  // the drain after a takeover, on the next turn
  ipc::UvHandle<uv_signal_t> sigterm_;
  ipc::UvHandle<uv_signal_t> sigint_;
  ipc::UvHandle<uv_signal_t> sighup_;
};

}  // namespace warmpool::supervisor
