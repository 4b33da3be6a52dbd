// warmpoold's state and its reactions: client requests, worker replies, worker deaths, deadlines.
// One thread, one libuv loop. The model index in the segment is the single source of truth for
// model state, bytes and LRU order; this class keeps beside it only what is process-local (who is
// waiting for what, which job went to which worker).
//
// Every accepted request is answered exactly once: replies go through Answer(), and each Call is
// consumed by it (a waiter is removed from its queue, a job is marked answered) before the reply is
// sent, so a later event for the same request finds nothing to answer.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <uv.h>

#include "common/status.h"
#include "ipc/uv_handle.h"
#include "ipc/warmpool.pb.h"
#include "shm/inflight.h"
#include "shm/model_index.h"
#include "shm/segment.h"
#include "supervisor/client_server.h"
#include "supervisor/config.h"
#include "supervisor/registry.h"
#include "supervisor/scheduler.h"
#include "supervisor/service_manager.h"
#include "supervisor/worker_pool.h"

namespace warmpool::supervisor {

inline constexpr char kVersion[] = "0.1.0";

// Work queued in one worker's channel is bounded: beyond this, requests wait in the daemon (and
// count against max_queue) instead of piling up in a socket buffer without end.
inline constexpr uint64_t kMaxWorkerPendingBytes = 256ull << 20;
inline constexpr uint32_t kMaxWorkerPendingJobs = 256;

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
  // Who to answer.
  struct Call {
    uint64_t session = 0;
    uint64_t request_id = 0;
  };
  // A request waiting for its model to be loaded, for room to load it, or for room in its worker.
  struct Waiter {
    Call call;
    bool is_infer = false;
    v1::InferRequest infer;
    uint64_t deadline_ms = 0;  // monotonic; 0 = none
    uint32_t crashes = 0;      // workers that died while running this very request
  };
  struct Job {
    enum class Kind { kLoad, kInfer, kUnload, kPark };
    Kind kind = Kind::kInfer;
    uint32_t worker = 0;
    uint32_t model = 0;
    Call call;
    bool answered = false;
    uint64_t deadline_ms = 0;   // infer: the request's deadline
    uint64_t started_ms = 0;
    uint64_t progress_ms = 0;   // load: last sign of progress
    bool attach = false;        // load: attaching held weights rather than reading the file
    bool extra_replica = false; // attach: one more replica of a ready model
    bool unpark = false;        // attach: from the parked host copy
    uint64_t bytes = 0;         // frame bytes sent to the worker
    uint32_t crashes = 0;
    v1::InferRequest request;   // infer: kept so that the request can be retried on another worker
  };
  // A worker runs file loads on its load thread, everything else in order on its serving thread.
  static bool OnLoadThread(const Job& job) { return job.kind == Job::Kind::kLoad && !job.attach; }
  // Process-local companions of a model record.
  struct ModelRuntime {
    std::deque<Waiter> waiters;
    std::vector<Call> unload_waiters;
    bool unload_when_idle = false;
    uint64_t workspace_bytes = 0;  // last reported; part of the next admission
    std::string last_error;        // in full (the segment keeps a truncated copy)
    uint32_t in_features = 0;
    uint32_t out_features = 0;
    std::deque<uint64_t> crash_ms;  // monotonic times of recent worker crashes caused by it
    uint64_t failed_until_ms = 0;   // cooldown end; requests before it are refused
    uint64_t cooldown_ms = 0;       // the next cooldown (doubles, capped)
    // Shared weights: the region's handle, held while the model is resident so that a worker's
    // death frees nothing; and the header bytes that let a worker attach them without the file.
    int weights_fd = -1;
    std::string header;
    uint64_t file_size = 0;
    // keep_alive: the configured one, a request's override, and when the model expires (0: never).
    // Workers serving the model from the one copy of its weights; the first is the record's.
    std::vector<uint32_t> replica_slots;
    uint32_t target_replicas = 1;
    uint32_t unloads_pending = 0;
    // Parking: the unload under way keeps a host copy (park_fd) when the worker has made it.
    bool parking = false;
    int park_fd = -1;
    std::vector<uint64_t> bulk;  // `unload --all` requests waiting for this model
    int64_t keep_alive_ms = -1;
    std::optional<int64_t> keep_alive_override_ms;
    uint64_t expires_at_ms = 0;
    // Reload: the model left the registry (or changed while loaded) and goes once idle; `next`
    // is what replaces it then (a changed model), empty for a removed one.
    bool retiring = false;
    std::optional<ModelEntry> next;
    bool registered_by_client = false;  // `warmpool register`: a reload leaves it alone
    Status refused;  // its path was refused at registration: requests get this, no worker loads it
    std::string registration_problem;  // what was wrong at registration (empty: nothing)
  };
  struct ArmedFault {
    v1::Fault fault;
    uint32_t remaining = 1;
  };

  // requests.cc
  void OnRequest(uint64_t session, const Peer& peer, v1::Envelope&& request);
  // Root, the daemon's own user, or a member of [access] admin_group.
  bool IsAdmin(const Peer& peer) const;
  void HandleLoad(const Call& call, const v1::LoadRequest& request);
  void HandleUnload(const Call& call, const v1::UnloadRequest& request);
  void HandleInfer(const Call& call, v1::InferRequest&& request);
  void HandlePin(const Call& call, const v1::PinRequest& request);
  // reload.cc
  void HandleRegister(const Call& call, const v1::RegisterRequest& request);
  // A registered model that new requests may use (kNil for one removed and on its way out).
  uint32_t FindServing(const std::string& name) const;
  void Answer(const Call& call, v1::Envelope&& reply);
  void AnswerError(const Call& call, const Status& status);

  // snapshots.cc
  v1::Envelope ModelsSnapshot() const;
  v1::Envelope PsSnapshot() const;
  v1::Envelope StatusSnapshot() const;
  int64_t RetryInMs(uint32_t model) const;

  // lifecycle.cc: loads, unloads, admission
  void EnsureLoading(uint32_t model);
  void TryAdmit(uint32_t model);
  void RetryPending();
  void StartLoad(uint32_t model, uint32_t worker, uint64_t bytes);
  void StartUnload(uint32_t model, bool eviction);
  void SendUnload(uint32_t model);
  void FailWaiters(uint32_t model, const Status& status);
  void OnWorkerMessage(uint32_t slot, v1::WorkerEnvelope&& message);
  void OnLoadDone(const Job& job, const v1::WorkerLoadDone& done, int weights_fd);
  void OnUnloadDone(const Job& job);
  void StartAttach(uint32_t model, uint32_t worker, bool extra_replica = false);
  void SendAttach(uint32_t model, uint32_t worker, bool extra_replica, bool unpark);
  // Attaches more workers until the model has its target number of replicas (as room allows).
  void GrowReplicas(uint32_t model);
  // The replica with the least outstanding work, or kNil when none has room.
  uint32_t PickReplica(uint32_t model) const;
  // The model leaves residency: its weights are released, unload waiters answered.
  void FinishUnload(uint32_t model);
  void DropWeights(uint32_t model);
  // Releases the device memory of a ready model: parked when the park budget allows, else dropped.
  void Release(uint32_t model, bool eviction);
  bool CanPark(uint32_t model) const;
  void StartUnpark(uint32_t model, uint32_t worker, uint64_t bytes);
  void OnParkDone(const Job& job, const v1::WorkerParkDone& done, int copy_fd);
  // Drops the least recently used parked (then idle) entries beyond max_cached.
  void EnforceMaxCached(uint32_t keep);
  void AnswerBulk(uint32_t model);
  uint64_t NewJob(Job&& job);

  // dispatch.cc: inference
  void Enqueue(uint32_t model, Waiter&& waiter, bool front = false);
  void DrainReady(uint32_t model);
  bool Dispatch(uint32_t model, Waiter& waiter);
  void OnInferDone(Job& job, v1::WorkerInferDone& done);

  // recovery.cc: worker deaths, crash loops, hangs, deadlines
  void OnWorkerDeath(uint32_t slot, uint32_t generation, const std::string& why);
  void RecordCrash(uint32_t model, const std::string& why);
  void MarkFailed(uint32_t model, const std::string& reason);
  Status FailedStatus(uint32_t model) const;
  void SweepDeadlines();
  // keep_alive: restart the model's clock when it becomes idle; release expired idle models.
  void StartKeepAlive(uint32_t model);
  void ExpireIdle(uint64_t now);
  void Preload();
  void FailEverything(const Status& status);

  // faults.cc
  void HandleFaultArm(const Call& call, const v1::FaultArmRequest& request);
  void HandleFaultClear(const Call& call);
  void OnFaultFired(uint64_t id);
  void SendFaults(uint32_t slot);
  void BroadcastFaults();

  // daemon.cc: start, systemd, reload, stop
  void RegisterModels();
  // Registers (or re-registers) one model found by the registry; false when it was refused.
  bool RegisterModel(const ModelEntry& entry);
  void InstallSignals();
  void StartTimer(ipc::UvHandle<uv_timer_t>& timer, uint64_t first_ms, uint64_t repeat_ms,
                  void (*fire)(Daemon*));
  // READY=1 once every preloaded model is ready or has failed.
  void CheckPreload();
  std::string StatusLine() const;
  void OnStatusTick();
  // SIGHUP: the registry again from the config file and the models directory. New and changed
  // models apply, removed ones go once their work ends, loaded unchanged ones keep serving.
  void Reload();
  void ReloadDone(const std::string& status);
  // A model leaving the registry: unloaded once idle, then forgotten.
  void RetireWhenIdle(uint32_t model);
  void MaybeRetire(uint32_t model);
  // SIGTERM: stop accepting, let accepted requests finish within drain_timeout_ms, then EndDrain.
  void BeginStop();
  void CheckDrained();
  void EndDrain(const std::string& why);
  void FinishStop();

  Config config_;
  std::string worker_path_;
  ConfigLoader reload_config_;
  uv_loop_t loop_{};
  shm::SharedSegment segment_;
  std::unique_ptr<shm::ModelIndex> index_;
  std::unique_ptr<shm::InflightTable> inflight_;
  std::unique_ptr<WorkerPool> workers_;
  std::unique_ptr<ClientServer> server_;
  PoolLimits limits_;
  std::optional<gid_t> admin_gid_;
  std::optional<gid_t> socket_gid_;
  std::optional<gid_t> observer_gid_;
  std::unique_ptr<ServiceManager> service_;
  bool ready_sent_ = false;

  std::vector<ModelRuntime> runtime_;        // by model index
  std::deque<uint32_t> pending_admission_;   // models waiting for room or a worker, FIFO
  std::unordered_map<uint64_t, Job> jobs_;
  uint64_t next_job_ = 1;
  std::vector<uint32_t> worker_models_;       // resident models per worker slot
  std::vector<uint32_t> worker_outstanding_;  // jobs sent and not answered per worker slot
  std::vector<uint64_t> worker_pending_bytes_;  // their frame bytes: bounded so that one busy
                                                // worker cannot make the supervisor buffer without end
  std::vector<uint64_t> worker_load_done_ms_;     // when each worker last finished a load
  std::vector<uint64_t> worker_serving_done_ms_;  // ... an infer or an unload
  std::vector<uint32_t> preloading_;  // preload models not yet ready (or failed)
  struct BulkUnload {
    Call call;
    uint32_t remaining = 0;
    uint32_t parked = 0;
    uint32_t total = 0;
  };
  std::unordered_map<uint64_t, BulkUnload> bulk_unloads_;
  uint64_t next_bulk_ = 1;
  std::vector<ArmedFault> faults_;
  uint64_t next_fault_id_ = 1;
  uint32_t queued_ = 0;                       // waiters over all models
  bool retrying_ = false;
  bool stopping_ = false;     // no new requests; accepted ones drain
  bool drain_ended_ = false;  // workers are being stopped
  int exit_code_ = 0;

  ipc::UvHandle<uv_timer_t> sweep_timer_;
  ipc::UvHandle<uv_timer_t> status_timer_;
  ipc::UvHandle<uv_timer_t> drain_timer_;
  std::unordered_map<uv_timer_t*, void (*)(Daemon*)> timer_actions_;  // StartTimer's callbacks
  ipc::UvHandle<uv_signal_t> sigterm_;
  ipc::UvHandle<uv_signal_t> sigint_;
  ipc::UvHandle<uv_signal_t> sighup_;
};

}  // namespace warmpool::supervisor
