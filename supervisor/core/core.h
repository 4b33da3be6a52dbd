// warmpoold's decisions: every event in, the actions that follow out. No libuv, sockets,
// processes, clock reads or randomness live here: the shell (supervisor/daemon.cc) and the
// simulator (sim/) drive the same code. The model index in the segment (over a mapping in the
// daemon, over a byte vector in the simulator) is the single source of truth for model state,
// bytes and LRU order; this class keeps beside it only what is process-local (who is waiting for
// what, which job went to which worker).
//
// Every accepted request is answered exactly once: replies go through Answer(), and each Call is
// consumed by it (a waiter is removed from its queue, a job is marked answered) before the reply is
// emitted, so a later event for the same request finds nothing to answer.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "ipc/warmpool.pb.h"
#include "shm/model_index.h"
#include "shm/segment.h"
#include "supervisor/config.h"
#include "supervisor/core/actions.h"
#include "supervisor/core/events.h"
#include "supervisor/core/model_entry.h"
#include "supervisor/core/scheduler.h"

namespace warmpool::supervisor {

inline constexpr char kVersion[] = "0.1.0";

// Work queued in one worker's channel is bounded: beyond this, requests wait in the daemon (and
// count against max_queue) instead of piling up in a socket buffer without end.
inline constexpr uint64_t kMaxWorkerPendingBytes = 256ull << 20;
inline constexpr uint32_t kMaxWorkerPendingJobs = 256;
// The shell's tick and the status line's period.
inline constexpr uint64_t kTickMs = 50;
inline constexpr uint64_t kStatusPeriodMs = 250;

class Core {
 public:
  Core(Config config, shm::SegmentView segment);
  ~Core();

  // Registers the models found at start and starts the preloads.
  std::vector<Action> Start(std::vector<ModelEntry> entries, std::vector<std::string> warnings,
                            Time now);
  std::vector<Action> Handle(Event event, Time now);

  // For the shell's exit status and for the simulator's checks.
  bool stopped() const { return stopped_; }
  // Requests accepted and not yet answered, over every open session.
  uint64_t unanswered() const { return unanswered_; }
  const shm::ModelIndex& index() const { return *index_; }
  // Handles the core holds, for the simulator's checks: (model, handle).
  std::vector<std::pair<uint32_t, int>> HeldHandles() const;
  // Cross-checks of the core's own records (invariants.cc); the simulator calls it after every
  // event.
  Status CheckInvariants() const;

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
    bool inspecting = false;        // its file is being looked at again (after a cooldown) ...
    bool inspected = false;         // ... and was found loadable: the next admission loads it
    // Shared weights: the region's handle, held while the model is resident so that a worker's
    // death frees nothing; and the header bytes that let a worker attach them without the file.
    int weights_fd = -1;
    std::string header;
    uint64_t file_size = 0;
    // Workers serving the model from the one copy of its weights; the first is the record's.
    std::vector<uint32_t> replica_slots;
    uint32_t target_replicas = 1;
    uint32_t unloads_pending = 0;
    // Parking: the unload under way keeps a host copy (park_fd) when the worker has made it.
    bool parking = false;
    int park_fd = -1;
    std::vector<uint64_t> bulk;  // `unload --all` requests waiting for this model
    // keep_alive: the configured one, a request's override, and when the model expires (0: never).
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
  struct WorkerSlot {
    bool ready = false;   // hello received, not dead
    bool fatal = false;   // exited with status 2 or could not start: never again
    uint32_t generation = 0;
    uint32_t models = 0;       // resident models
    uint32_t outstanding = 0;  // jobs sent and not answered
    uint64_t pending_bytes = 0;  // their frame bytes: bounded so that one busy worker cannot make
                                 // the supervisor buffer without end
    uint64_t load_done_ms = 0;     // when it last finished a load
    uint64_t serving_done_ms = 0;  // ... an infer or an unload
    std::string last_exit;
  };
  struct ArmedFault {
    v1::Fault fault;
    uint32_t remaining = 1;
  };
  struct BulkUnload {
    Call call;
    uint32_t remaining = 0;
    uint32_t parked = 0;
    uint32_t total = 0;
  };

  // core.cc: events, start, status, stop
  void OnTick();
  void OnWorkerUp(const event::WorkerUp& up);
  template <typename... Args>
  void Log(LogLevel level, fmt::format_string<Args...> format, Args&&... args) {
    actions_.push_back(action::Log{level, fmt::format(format, std::forward<Args>(args)...)});
  }
  void SendToWorker(uint32_t slot, const v1::WorkerEnvelope& message, std::vector<int> handles = {});
  void CloseHandle(int handle);
  void RegisterModels(const std::vector<ModelEntry>& entries);
  // Registers (or re-registers) one model found by the registry; false when it was refused.
  bool RegisterModel(const ModelEntry& entry);
  void Preload();
  // READY=1 once every preloaded model is ready or has failed.
  void CheckPreload();
  std::string StatusLine() const;
  void OnStatusTick();
  // SIGTERM: stop accepting, let accepted requests finish within drain_timeout_ms, then EndDrain.
  void BeginStop();
  void CheckDrained();
  void EndDrain(const std::string& why);
  uint64_t MonoMs() const { return now_.mono_ms; }
  int64_t UnixMs() const { return static_cast<int64_t>(now_.unix_ns / 1000000); }

  // requests.cc
  void OnRequest(event::ClientRequest&& request);
  void HandleLoad(const Call& call, const v1::LoadRequest& request);
  void HandleUnload(const Call& call, const v1::UnloadRequest& request);
  void HandleInfer(const Call& call, v1::InferRequest&& request);
  void HandlePin(const Call& call, const v1::PinRequest& request);
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
  void OnModelInspected(const event::ModelInspected& inspected);
  void RetryPending();
  void StartLoad(uint32_t model, uint32_t worker, uint64_t bytes);
  void StartUnload(uint32_t model, bool eviction);
  void SendUnload(uint32_t model);
  void FailWaiters(uint32_t model, const Status& status);
  void OnWorkerMessage(event::WorkerMessage&& message);
  void OnLoadDone(const Job& job, const v1::WorkerLoadDone& done, int weights_fd);
  void OnUnloadDone(const Job& job);
  void StartAttach(uint32_t model, uint32_t worker, bool extra_replica = false);
  void SendAttach(uint32_t model, uint32_t worker, bool extra_replica, bool unpark);
  // Attaches more workers until the model has its target number of replicas (as room allows).
  void GrowReplicas(uint32_t model);
  // The replica with the least outstanding work, or kNil when none has room.
  uint32_t PickReplica(uint32_t model) const;
  std::vector<WorkerLoad> Loads() const;
  bool AnyCanServe() const;
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
  // keep_alive: restart the model's clock when it becomes idle; release expired idle models.
  void StartKeepAlive(uint32_t model);
  void ExpireIdle(uint64_t now);

  // recovery.cc: worker deaths, crash loops, hangs, deadlines
  void OnWorkerDown(const event::WorkerDown& down);
  void RecordCrash(uint32_t model, const std::string& why);
  void MarkFailed(uint32_t model, const std::string& reason);
  Status FailedStatus(uint32_t model) const;
  void SweepDeadlines();
  void FailEverything(const Status& status);

  // faults.cc
  void HandleFaultArm(const Call& call, const v1::FaultArmRequest& request);
  void HandleFaultClear(const Call& call);
  void OnFaultFired(uint64_t id);
  void SendFaults(uint32_t slot);
  void BroadcastFaults();

  // reload.cc: SIGHUP and `warmpool register`. New and changed models apply, removed ones go once
  // their work ends, loaded unchanged ones keep serving.
  void Reload(event::Reload&& reload);
  void ReloadDone(const std::string& status);
  void HandleRegister(const Call& call, const v1::RegisterRequest& request,
                      std::optional<Result<ModelEntry>>&& registration);
  // A model leaving the registry: unloaded once idle, then forgotten.
  void RetireWhenIdle(uint32_t model);
  void MaybeRetire(uint32_t model);

  Config config_;
  Time now_;
  std::vector<Action> actions_;
  std::unique_ptr<shm::ModelIndex> index_;
  PoolLimits limits_;
  bool ready_sent_ = false;

  std::vector<ModelRuntime> runtime_;        // by model index
  std::deque<uint32_t> pending_admission_;   // models waiting for room or a worker, FIFO
  std::unordered_map<uint64_t, Job> jobs_;
  uint64_t next_job_ = 1;
  std::vector<WorkerSlot> workers_;
  std::vector<uint32_t> preloading_;  // preload models not yet ready (or failed)
  std::unordered_map<uint64_t, BulkUnload> bulk_unloads_;
  uint64_t next_bulk_ = 1;
  std::vector<ArmedFault> faults_;
  uint64_t next_fault_id_ = 1;
  uint32_t queued_ = 0;                       // waiters over all models
  std::unordered_map<uint64_t, uint32_t> sessions_;  // unanswered requests per open session
  uint64_t unanswered_ = 0;
  bool retrying_ = false;
  bool stopping_ = false;     // no new requests; accepted ones drain
  bool drain_ended_ = false;  // workers are being stopped
  bool stopped_ = false;
  uint64_t drain_deadline_ms_ = 0;
  uint64_t next_status_ms_ = 0;
};

}  // namespace warmpool::supervisor
