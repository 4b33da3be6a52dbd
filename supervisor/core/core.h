// warmpoold's decisions: every event in, the actions that follow out. No libuv, sockets,
// processes, clock reads or randomness live here: the shell (supervisor/daemon.cc) and the
// simulator (sim/) drive the same code. Each model's residency is one explicit state machine
// (model.h); what to evict, retry and where to place work are pure policies (supervisor/policy/).
// The segment's records are derived from the machines and published by them.
//
// Every accepted request is answered exactly once, and never after its client is gone: replies
// go through Answer(), which consumes the Call (a waiter leaves its queue, a job is marked
// answered) and drops the reply of a session that has left; a departed session's waiting
// requests are dropped before they run.
//
// Files: core.cc (events, start, ticks, stop), requests.cc (client requests, sessions, budgets),
// admission.cc (room, loads, releases, eviction), replicas.cc (replicas, placement), jobs.cc
// (what workers report), dispatch.cc (inference), recovery.cc (deaths, deadlines, stalls),
// failures.cc (crash loops, broken files), workers.cc (worker processes), reload.cc (reload,
// register, retirement), faults.cc, snapshots.cc, invariants.cc; records.h, what it keeps.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/status.h"
#include "common/version.h"
#include "ipc/warmpool.pb.h"
#include "ipc/worker.pb.h"
#include "shm/model_index.h"
#include "shm/segment.h"
#include "supervisor/config.h"
#include "supervisor/core/actions.h"
#include "supervisor/core/events.h"
#include "supervisor/core/prefix_homes.h"
#include "supervisor/core/kept.h"
#include "supervisor/core/kept_memory.h"
#include "supervisor/core/model.h"
#include "supervisor/core/model_entry.h"
#include "supervisor/core/records.h"
#include "supervisor/policy/admission.h"
#include "supervisor/policy/placement.h"
#include "supervisor/policy/retry.h"

namespace warmpool::supervisor {

// The project's version (project(... VERSION) in CMake), as status and the metrics report it.
inline constexpr const char* kVersion = kProjectVersion;
// The shell ticks the core this often; the status line goes out at most this often.
inline constexpr uint64_t kTickMs = 50;
inline constexpr uint64_t kStatusPeriodMs = 250;
// Work that may wait in one worker's channel (policy::Window): beyond it requests wait in the
// daemon, where they can go to another replica, time out, or be dropped when their client leaves.
inline constexpr uint32_t kWorkerWindowJobs = 16;
inline constexpr uint64_t kWorkerWindowBytes = 64ull << 20;
// While retried requests of a model wait for their turn (dispatch.cc), new ones pass them only
// into this much of a worker's window: enough to keep the worker busy, few enough that each retry
// waits behind a handful of them.
inline constexpr uint32_t kPassingRetryJobs = 4;
// Shared-memory regions one connection may hold registered, and all connections together: each
// holds one of the daemon's descriptors, which its worker channels need too.
inline constexpr uint32_t kMaxRegionsPerConnection = 16;
inline constexpr uint32_t kMaxRegions = 1024;

// A failure a retry of the same file cannot cure: its contents, its absence, its permissions.
bool IsFileProblem(const Status& cause);

class Core {
 public:
  Core(Config config, shm::SegmentView segment);
  ~Core();

  // Registers the models found at start, adopts the weights a supervisor before this one kept
  // (adoption.cc; least recently used first), asks for the workers and starts the preloads.
  std::vector<Action> Start(std::vector<ModelEntry> entries, std::vector<std::string> warnings,
                            Time now, std::vector<KeptWeights> kept = {});
  std::vector<Action> Handle(Event event, Time now);

  // For the shell's exit status and for the simulator's checks.
  bool stopped() const { return stopped_; }
  bool stopping() const { return stopping_; }
  // Requests accepted and not yet answered, over every open session.
  uint64_t unanswered() const { return unanswered_; }
  // Bytes of requests the daemon holds (queued or running), over every open session.
  uint64_t held_bytes() const { return held_bytes_; }
  const shm::ModelIndex& index() const { return *index_; }
  // The model a request names: its registered name, or a configured alias of one; kNil if none.
  uint32_t Resolve(const std::string& name) const;
  // The weights worth keeping across a restart, least recently used first (adoption.cc).
  std::vector<KeptWeights> Kept() const;
  // Models adopted at start.
  uint32_t adopted() const { return adopted_; }
  // Handles the core holds: (model, handle); clients' regions with model shm::kNil.
  std::vector<std::pair<uint32_t, int>> HeldHandles() const;
  // Memory let go of that the shell keeps for reuse, as the core counts it (core/kept_memory.h).
  const KeptMemory& kept_memory() const { return kept_memory_; }
  // Cross-checks of the core's own records (invariants.cc); the simulator calls it after every
  // event.
  Status CheckInvariants() const;

 private:
  using Call = records::Call;
  using Waiter = records::Waiter;
  using Job = records::Job;
  using Model = records::Model;
  using ClientRegion = records::ClientRegion;
  using Session = records::Session;
  using WorkerSlot = records::WorkerSlot;
  using ArmedFault = records::ArmedFault;
  using BulkUnload = records::BulkUnload;
  static bool OnLoadThread(const Job& job) { return job.load_thread; }

  // core.cc
  template <typename... Args>
  void Log(LogLevel level, fmt::format_string<Args...> format, Args&&... args) {
    actions_.push_back(action::Log{level, fmt::format(format, std::forward<Args>(args)...)});
  }
  void Send(uint32_t worker, const v1::WorkerEnvelope& message, std::vector<int> handles = {});
  // A frame that starts a job allocating `bytes` of device memory (action::SendToWorker::allocates).
  void SendAllocating(uint32_t worker, const v1::WorkerEnvelope& message, uint64_t job, uint64_t bytes,
                      std::vector<int> handles = {});
  void Close(int handle);
  void Close(const std::vector<int>& handles);
  // The same for memory no process maps any more (released weights, a parked copy let go), each
  // region of `bytes`: kept for the next allocation where the backend reuses memory, unless a
  // daemon before this one kept it or a takeover is under way (core/kept_memory.h).
  void CloseMemory(int handle, uint64_t bytes);
  void CloseMemory(const std::vector<int>& handles, uint64_t bytes);
  // After every event: kept memory goes, oldest first, until used + kept fits the budget.
  void TrimKept();
  bool KeepsFreedMemory() const { return config_.backend != Backend::kCuda && DeviceCount() == 1; }
  void OnHandingOver();
  void OnTick(const event::Tick& tick);
  void OnStatusTick();
  void Preload();
  void CheckPreload();
  std::string StatusLine() const;
  void BeginStop(bool handed_over);
  void CheckDrained();
  void EndDrain(const std::string& why);
  uint64_t MonoMs() const { return now_.mono_ms; }
  int64_t UnixMs() const { return static_cast<int64_t>(now_.unix_ns / 1000000); }
  // The pool's limits; budget_bytes is 0 here, each device has its own (Budget).
  policy::Limits Limits() const;
  uint32_t DeviceCount() const { return static_cast<uint32_t>(config_.devices.size()); }
  uint64_t Budget(uint32_t device) const { return config_.devices[device].budget_bytes; }
  uint32_t DeviceOf(uint32_t worker) const { return worker / config_.workers_per_device; }
  // Room for `bytes` more on the device (within its budget).
  bool Fits(uint32_t device, uint64_t bytes) const;
  // Models can ever be served there: not lost for good, and a worker that is not fatal.
  bool DeviceUsable(uint32_t device) const;
  policy::RetrySettings RetrySettings() const;
  uint64_t NewJob(Job&& job);
  Job* FindJob(uint64_t id);

  // requests.cc
  void OnRequest(event::ClientRequest&& request);
  void OnClientGone(uint64_t session);
  void HandleLoad(const Call& call, const v1::LoadRequest& request);
  void HandleUnload(const Call& call, const v1::UnloadRequest& request);
  void HandleUnloadAll(const Call& call);
  void HandleInfer(Call call, v1::InferRequest&& request);
  void HandleGenerate(Call call, v1::GenerateRequest&& request);
  void HandleEmbed(Call call, v1::EmbedRequest&& request);
  // A language model's request (a generation, embeddings) into its model's queue, its `bytes` held
  // against the daemon's and the connection's bounds; answered at once when the queue is full or
  // the bounds would be passed.
  void EnqueueHeld(uint32_t model, Waiter&& waiter, uint64_t bytes);
  void HandlePin(const Call& call, const v1::PinRequest& request);
  // regions.cc: clients' shared memory. A slice must lie in a region of its own connection.
  void HandleRegion(const Call& call, const v1::RegionRequest& request, int handle, const Status& check);
  Result<const ClientRegion*> FindRegion(uint64_t session, const v1::RegionSlice& slice, const char* what) const;
  Status CheckRegions(uint64_t session, const v1::InferRequest& request) const;
  void CloseRegions(Session& session);
  // Tells the workers to unmap regions the core let go.
  void ForgetRegions(const std::vector<uint64_t>& ids);
  // A registered model that new requests may use; an error (NOT_FOUND, or why it was refused).
  Result<uint32_t> FindServing(const std::string& name) const;
  void Answer(const Call& call, v1::Envelope&& reply);
  void AnswerError(const Call& call, const Status& status);
  void AnswerUnloads(uint32_t model);

  // admission.cc and replicas.cc: room, loads, releases, replicas, placement
  std::vector<policy::Resident> Residents() const;
  // The workers as the placement policy sees them; WorkerLoads leaves `models` at 0 (enough for
  // PickReplica, and cheap enough for every request).
  std::vector<policy::WorkerView> WorkerViews() const;
  std::vector<policy::WorkerView> WorkerLoads() const;
  // WorkerViews with only the device's workers up: what placement on that device may pick.
  std::vector<policy::WorkerView> WorkerViewsOn(uint32_t device) const;
  std::vector<policy::DeviceRoom> DeviceRooms() const;
  // The park account plus the host copies already decided (being made).
  uint64_t ParkCommitted() const;
  void TryAdmit(uint32_t model);
  void Wait(uint32_t model);
  void RetryPending();
  void StartLoad(uint32_t model, uint32_t worker, uint64_t bytes);
  void StartUnpark(uint32_t model, uint32_t worker, uint64_t bytes);
  void AttachReplica(uint32_t model, uint32_t worker, uint32_t moving_from = shm::kNil);
  // What an attach or unpark tells the worker: the weights' own description, not the file's.
  static void DescribeAttach(v1::WorkerAttach* attach, uint32_t model, const ModelEntry& entry,
                             const Weights& weights);
  // Releases the device memory of a ready model (parked when allowed and the budget has room).
  // Logged here with its reason, whoever decided it; `why` says more (whose room, which limit).
  void Release(uint32_t model, shm::ReleaseReason reason, bool allow_park, std::string_view why = {});
  // adoption.cc
  Status CheckKept(const KeptWeights& kept) const;
  bool KeepsDeviceWeights() const;
  // action::StoreKept when what is worth keeping changed (kept.h's cadence); `now`: after the
  // start and at the end of a stop, whatever the time since the last one.
  void StoreKeptWhenDue(bool now);
  // Weights first (AdoptWeights), then the KV caches kept with parked copies (AdoptKvCache): each
  // goes with its model's copy if that was adopted parked, is of the same weights, and the park
  // budget has room; else it is closed.
  void Adopt(std::vector<KeptWeights> kept);
  void AdoptWeights(std::vector<KeptWeights> kept);
  void AdoptKvCache(const KeptWeights& k);
  // A load, attach or unpark that succeeded, for the segment's stats (shm/stats.h).
  void CountLoad(uint32_t model, shm::LoadSource source, uint64_t started_ms);
  // The gauges of the segment's PoolStats: at start and every tick.
  void PublishGauges();
  void SendRelease(uint32_t model);
  void FinishRelease(uint32_t model);
  void DropParked(uint32_t model, shm::ReleaseReason reason, std::string_view why = {});
  // Tells a worker to let go of its replica of the model; the job's id.
  uint64_t SendUnload(uint32_t model, uint32_t worker);
  // A replica of a ready model leaves (fewer replicas, or a move).
  void SendLeave(uint32_t model, uint32_t worker);
  void FailWaiters(uint32_t model, const Status& status);
  // Replicas up to the target (as room allows), down to it (the most crowded worker's goes);
  // why it stopped short of the target (empty: it did not).
  std::string AdjustReplicas(uint32_t model);
  void EnforceMaxCached(uint32_t keep);
  // keep_alive expiry judged as of `as_of`: what clients sent before then was read.
  void ExpireIdle(uint64_t as_of);
  void Rebalance();
  void Rebalance(uint32_t device);

  // jobs.cc: what workers report
  void OnWorkerMessage(event::WorkerMessage&& message);
  void OnLoadDone(const Job& job, const v1::WorkerLoadDone& done, int handle);
  void OnAttachDone(const Job& job, const v1::WorkerLoadDone& done);
  void OnUnparkDone(const Job& job, const v1::WorkerLoadDone& done, int handle);
  void OnReady(uint32_t model, uint64_t started_ms, const char* how);
  void OnUnloadDone(const Job& job, uint64_t id);
  void OnParkDone(const Job& job, const v1::WorkerParkDone& done, int handle, KeptKvCache& cache);
  // The registration follows the file as a worker or the shell found it (not the problem it was
  // registered with): `now` becomes its description.
  void FollowFile(uint32_t model, const WeightsDescription& now);
  // What a load read, as its worker reported it (the version from the registration when the
  // report has none and the header is the registered one).
  WeightsDescription LoadedWeights(uint32_t model, const v1::WorkerLoadDone& done) const;

  // dispatch.cc: inference
  void Enqueue(uint32_t model, Waiter&& waiter);
  void DrainReady(uint32_t model);
  void Dispatch(uint32_t model, uint32_t worker, Waiter&& waiter);
  // The job that runs a waiting request on `worker` (the request itself is the caller's to move).
  Job InferJobFor(uint32_t model, uint32_t worker, const Waiter& waiter) const;
  // The model is busy with job `id` (sent in `infer`): counted in flight, touched, the deadline told.
  void StartInferJob(uint32_t model, uint64_t id, v1::WorkerInfer* infer);
  void OnInferDone(Job& job, v1::WorkerInferDone& done);
  // Generations (core/generate.cc): dispatched, streamed, answered, cancelled.
  // A generation or embeddings (core/generate.cc): alone on the worker, never batched.
  void DispatchLanguageJob(uint32_t model, uint32_t worker, Waiter&& waiter);
  // Of the model's serving replicas, those running fewer of its generations than their engine runs
  // at once (Weights::sequences).
  std::vector<uint32_t> WithFreeSequences(uint32_t model, const std::vector<uint32_t>& serving) const;
  // The model's generations sent to `worker` and not yet answered.
  uint32_t GenerationsOn(uint32_t model, uint32_t worker) const;
  // Of those, the ones with room for a generation a replica's KV cache refused for want of
  // `blocks` (Waiter::kv_blocks; 0: all): the cache has that many free of what its generations may
  // need, as it last said, or it runs none of the model's generations. The most room first (of
  // replicas equally busy, a generation goes to the one with the most room).
  std::vector<uint32_t> WithKvRoom(uint32_t model, const std::vector<uint32_t>& replicas, uint64_t blocks) const;
  // A generation a replica's engine refused for want of room in its KV cache (WorkerInferDone.kv_full),
  // nothing of it run: back to the front of its model's queue, to go where there is room. True when
  // it went back; false when it cannot (its replica runs none of the model's generations, so no
  // room will come there by waiting: the refusal is its answer).
  bool RequeueKvRefused(Job& job, const v1::WorkerInferDone& done);
  void OnInferChunk(uint32_t slot, const v1::WorkerInferChunk& chunk);
  void SendChunk(const Call& call, v1::Envelope&& chunk);  // not an answer: the call stays open
  void AnswerGenerate(Job& job, v1::WorkerInferDone& done);
  void CancelGenerations(uint64_t session);
  // A generation's tokens and times into its model's stats (shm/stats.h), whoever still waits.
  void CountGeneration(const Job& job, const v1::WorkerInferDone& done);
  // Typed tensors (core/dispatch.cc): alone on the worker, never batched.
  void DispatchTyped(uint32_t model, uint32_t worker, Waiter&& waiter);
  // Embeddings (core/embed.cc): an inference whose answer is vectors.
  void AnswerEmbed(Job& job, v1::WorkerInferDone& done);
  // An inference of the model's current registration ended: its counts, keep_alive, its queue.
  void DoneOnCurrent(uint32_t model);
  void StartKeepAlive(uint32_t model);

  // recovery.cc: worker deaths, hangs, deadlines; failures.cc: crash loops, broken files
  void OnWorkerDown(const event::WorkerDown& down);
  void OnDeviceLost(const event::DeviceLost& lost);
  void OnDeviceRestored(const event::DeviceRestored& restored);
  // Retries of a dead worker's requests, reordered: those that never ran at a crash first, and
  // connections taking turns, the ones with fewer to retry first within a turn.
  static std::vector<std::pair<uint32_t, Waiter>> TakingTurns(std::vector<std::pair<uint32_t, Waiter>> retries);
  // KV caches (core/kv_caches.cc). A language-model replica's cache region (engine ABI version 10)
  // came with its load, attach or unpark reply: held while that worker serves the model, else
  // closed. The caches of a worker that died go to its model's generations retried from it, and
  // are held while one of them may still read it (until its first chunk).
  void KeepReplicaCache(uint32_t model, uint32_t worker, KeptKvCache cache);
  // A replica whose unload came back while its model parks: its engine closed cleanly, and its cache
  // goes with the parked copy (residency::Releasing::kv_cache) when the park budget has room.
  void KeepCacheToPark(uint32_t model, uint32_t worker);
  void HandCachesToRetries(uint32_t slot, std::vector<std::pair<uint32_t, Waiter>>& retries);
  // After every event: caches of replicas that left, and sources nothing names any more, closed;
  // what replicas that left said of their caches, forgotten.
  void ForgetKvCaches();
  // A worker's word on its engine's KV cache for a model it serves (a generation's chunk or end).
  void NoteKvUsage(uint32_t model, uint32_t worker, const v1::KvUsage& usage);
  // `worker` holds a replica of `model` that has attached (not one on its way).
  bool AttachedReplica(uint32_t model, uint32_t worker) const;
  void ChargeCrash(uint32_t model, const std::string& why, bool alone);
  // file_broken: the file's contents (or its absence) are the cause; the messages say to fix it.
  void MarkFailed(uint32_t model, const std::string& reason, bool file_broken = false);
  // What to do about a broken file: where it is, and what reads it again.
  std::string FileFix(uint32_t model) const;
  Status FailedStatus(uint32_t model) const;
  void OnModelInspected(const event::ModelInspected& inspected);
  // Deadlines and stalls judged as of `as_of` (event::Tick::workers_read_ms), not of now: a
  // worker is judged only on what it had said by then.
  void SweepDeadlines(uint64_t as_of);
  void SweepStalls(uint64_t as_of);
  void FailEverything(const Status& status);

  // workers.cc: the worker processes
  void SpawnDue();
  void OnWorkerSpawned(const event::WorkerSpawned& spawned);
  void OnWorkerUp(const event::WorkerUp& up);
  // Writes every worker's record in the segment (after each event).
  void PublishWorkers();
  void KillWorker(uint32_t slot, const std::string& reason);
  void JobDone(Job& job);

  // faults.cc
  void HandleFaultArm(const Call& call, const v1::FaultArmRequest& request);
  void HandleFaultClear(const Call& call);
  // Which kind of job a fault point lies in (load.* in a load, attach.mid in an attach or unpark).
  static bool PointInJob(std::string_view point, Job::Kind kind);
  // Shots for a job about to be sent: the armed faults whose point lies in this kind of job.
  std::vector<v1::Fault> GrantFaults(Job& job);
  void OnFaultFired(const v1::WorkerFaultFired& fired);
  void ReturnFaults(const Job& job);

  // reload.cc
  void Reload(event::Reload&& reload);
  void ReloadDone(const std::string& status);
  void HandleRegister(const Call& call, const v1::RegisterRequest& request,
                      std::optional<Result<ModelEntry>>&& registration);
  bool RegisterModel(const ModelEntry& entry);
  void ApplySettings(Model& m);
  void Retire(uint32_t model, std::optional<ModelEntry> next);
  // After every event: retiring models that are now idle are re-registered or forgotten.
  void ProcessRetirements();

  // snapshots.cc
  // A model's sizes as every view names them (ModelInfo, PsEntry, LoadReply).
  struct Sizes {
    uint64_t weights = 0;
    uint64_t workspace = 0;  // every replica's on a device; else what one replica will need
  };
  Sizes SizesOf(uint32_t model) const;
  // Replicas serving or attaching (not leaving).
  uint32_t StayingReplicas(uint32_t model) const;
  // A load's answer: sizes, replicas (capped: why fewer than `asked`; `short_by` is what
  // AdjustReplicas said), the models evicted for it (Model::evicted_for).
  v1::Envelope LoadReplyFor(uint32_t model, uint32_t asked, const std::string& short_by) const;
  v1::Envelope ModelsSnapshot() const;
  v1::Envelope PsSnapshot() const;
  v1::Envelope StatusSnapshot() const;
  int64_t RetryInMs(uint32_t model) const;

  Config config_;
  Time now_;
  std::vector<Action> actions_;
  std::unique_ptr<shm::ModelIndex> index_;
  shm::SegmentView segment_;
  bool ready_sent_ = false;

  std::vector<Model> models_;                // by model index
  uint64_t epochs_ = 0;                      // registrations so far (Model::epoch)
  std::vector<std::pair<std::string, std::string>> refused_;  // beyond max_models: name, why
  std::deque<uint32_t> pending_admission_;   // models waiting for room or a worker, FIFO
  std::unordered_map<uint64_t, Job> jobs_;
  uint64_t next_job_ = 1;
  std::vector<WorkerSlot> workers_;
  // Devices whose memory is gone (DeviceLost) and not back yet (DeviceRestored), or never will be
  // (their owner cannot run): nothing is placed there meanwhile.
  std::vector<bool> devices_down_;
  std::vector<bool> devices_gone_;  // for good
  uint32_t adopted_ = 0;
  KeptMemory kept_memory_;  // device 0's: only the host backend keeps (one device)
  std::unordered_set<int> adopted_memory_;  // handles of adopted weights while the core holds them
  std::map<std::pair<uint32_t, uint32_t>, KeptKvCache> replica_caches_;  // (model, worker) -> its KV cache
  // Dead replicas' caches that retried generations name, by descriptor. One on a device (a GPU's
  // pool) counts against its device's room with its model's weights while it is held (Residents).
  struct KvSource {
    uint64_t bytes = 0;
    bool on_device = false;
    uint32_t model = 0;
  };
  std::map<int, KvSource> kv_sources_;
  // Bytes of `model`'s dead replicas' caches held on its device.
  uint64_t DeviceKvSourceBytes(uint32_t model) const;
  // (model, worker) -> what that replica's engine last said of its KV cache: blocks held, all, and
  // those its generations may come to need (less what was sent there since: WithKvRoom).
  struct KvUsageSaid {
    uint64_t held = 0;
    uint64_t blocks = 0;
    uint64_t reserved = 0;
  };
  std::map<std::pair<uint32_t, uint32_t>, KvUsageSaid> kv_usage_;
  // Where prompts went, by their prefixes: a generation prefers the replica its beginning went to
  // (dispatch.cc); forgotten with that replica's cache (ForgetKvCaches).
  PrefixHomes prefix_homes_;
  uint64_t kv_refusals_ = 0;  // generations refused for want of KV cache room so far (Waiter::refused_as)
  bool handing_over_ = false;  // event::HandingOver: nothing is kept from then on
  // What action::StoreKept last said (adoption.cc): handle, parked, name of each, in order.
  std::vector<std::tuple<int, bool, std::string>> kept_stored_;
  bool kept_stored_once_ = false;
  uint64_t kept_stored_ms_ = 0;
  uint64_t kept_looked_changes_ = 0;  // the segment's change count when Kept() was last looked at
  uint64_t kept_looked_ms_ = 0;
  uint64_t infer_jobs_ = 0;  // jobs_ of kind kInfer: the in-flight gauge, without a walk per tick
  std::vector<uint32_t> preloading_;  // preload models not yet ready (or failed)
  std::unordered_map<uint64_t, BulkUnload> bulk_unloads_;
  uint64_t next_bulk_ = 1;
  std::vector<ArmedFault> faults_;
  uint64_t next_fault_id_ = 1;
  uint32_t queued_ = 0;  // waiters over all models
  uint64_t next_region_ = 1;  // ids of client regions, never reused
  uint32_t regions_ = 0;      // registered over every session
  std::unordered_map<uint64_t, Session> sessions_;
  uint64_t unanswered_ = 0;
  uint64_t held_bytes_ = 0;
  bool retrying_ = false;
  bool stopping_ = false;     // no new requests; accepted ones drain
  bool handed_over_ = false;  // ... and a new daemon serves the socket (supervisor/takeover.h)
  bool drain_ended_ = false;  // workers are being stopped
  bool stopped_ = false;
  uint64_t drain_deadline_ms_ = 0;
  uint64_t next_status_ms_ = 0;
};

}  // namespace warmpool::supervisor
