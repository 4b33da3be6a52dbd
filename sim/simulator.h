// A deterministic simulator for the supervisor's core (after FoundationDB's simulation testing
// and TigerBeetle's VOPR). From a seed it builds a world around the real core: clients that
// pipeline, disconnect and come back; workers that follow the worker protocol (two threads, the
// in-flight markers, handles passed with frames) and crash, hang, stall or answer late at any
// step; model files that change on disk; reloads; the stop. Time is simulated and every choice
// comes from the seed, so a failure replays exactly with the same seed.
//
// After every event handed to the core it checks the invariants: every accepted request answered
// exactly once and never after its client is gone; every successful answer computed from the
// weights of one consistent version of its model, and never from a version older than the one a
// reload had registered when the request came; the segment valid (LRU, accounting, budget);
// the core's own invariants; the handles the core holds are exactly the open ones, and none was
// closed while a frame queued for a worker still named it; no two file loads of one model at once;
// the requests' bytes the daemon holds within its bounds; no request of a departed client run;
// no worker left idle while another holds several models; no request waiting long for a resident
// model that no busy worker holds while a worker idles.
//
// The supervisor itself is killed and started again now and then (restart.cc): what the shell
// had put in the service manager's descriptor store goes to a new core, under budgets that may
// have changed; what that core adopts must be exactly the current version of its model's file.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <memory>
#include <queue>
#include <set>
#include <string>
#include <vector>

#include "engines/transformer/kv_cache.h"
#include "ipc/warmpool.pb.h"
#include "ipc/worker.pb.h"
#include "shm/segment.h"
#include "sim/files.h"
#include "sim/rng.h"
#include "supervisor/core/core.h"

namespace warmpool::sim {

struct Options {
  uint64_t seed = 1;
  uint64_t events = 10000;  // core events before the stop
  bool trace = false;       // print every event and action as it happens
};

struct Outcome {
  bool ok = true;
  std::string failure;             // the first invariant broken
  uint64_t events = 0;             // core events handled
  uint64_t sim_ms = 0;             // simulated time
  uint64_t requests = 0;           // client requests sent
  uint64_t replies_ok = 0;         // successful infer replies checked
  uint64_t worker_deaths = 0;
  uint64_t kv_waits = 0;           // generations a worker sent back for want of KV room
  uint64_t preemptions = 0;        // of them, preempted mid-generation (engine ABI version 13)
  uint64_t device_caches = 0;      // KV caches loaded in device memory (a GPU's pool)
  uint64_t pool_copies = 0;        // of them, copied out to host memory to park
  uint64_t restarts = 0;           // of the supervisor
  uint64_t adopted = 0;            // models adopted warm by the supervisors after them
  std::vector<std::string> trace;  // the last lines before a failure
};

Outcome Run(const Options& options);

class Simulator {
 public:
  explicit Simulator(const Options& options);
  ~Simulator();
  Outcome Run();

 private:
  // A region of memory behind a handle: the weights of one version of one file (on the device,
  // or a host copy), or a client's shared memory.
  struct Region {
    uint32_t file = 0;
    uint32_t version = 0;
    uint64_t bytes = 0;
    bool host = false;
    uint32_t device = 0;  // where device memory is (not a host copy)
    bool client = false;  // a client's shared-memory region (RegionRequest), not weights
    // A language model's KV cache (WorkerLoadDone.cache_shared): of the weights above, written by
    // this life of this worker.
    bool kv_cache = false;
    uint32_t slot = 0;
    uint32_t generation = 0;
  };
  struct WorkerJob {
    v1::WorkerEnvelope message;
    int region = -1;  // the region a frame brought (attach), its last one (a KV source)
    int cache = -1;   // an unpark's parked KV cache (WorkerAttach.kv_cache), after the weights
    std::optional<SimFile> read;  // load: the file as it was when the load began
  };
  // A language engine's KV pages as the transformer engine keeps them (engines/transformer/
  // kv_cache.h: its pool and caches, of a one-float shape): a cache per generation it runs, which
  // the generation's prompt and steps fill and its end releases, full blocks joining the prefix
  // cache (sim/kv_pages.cc).
  struct KvPages {
    std::unique_ptr<transformer::KvPool> pool;
    std::map<uint64_t, std::unique_ptr<transformer::KvCache>> sequences;  // by job; destroyed before the pool
    // The blocks each generation it has taken may come to need, from its arrival to its end (as
    // the engine reserves them when it opens one: engine ABI version 12), and their sum.
    std::map<uint64_t, uint32_t> reserved;
    uint32_t reserved_blocks = 0;
  };
  struct Engine {
    std::string name;
    bool weights = false;
    Region region;           // what the weights are
    Described described{};   // what the engine was told they are
    int region_id = -1;
    std::shared_ptr<KvPages> kv;  // a language model's
    bool kv_on_device = false;    // its KV cache is device memory (a GPU's pool), not a memfd
  };
  struct Worker {
    uint32_t slot = 0;
    uint32_t device = 0;  // slot / workers_per_device
    uint32_t generation = 0;
    enum class State { kDown, kStarting, kUp } state = State::kDown;
    int pid = 0;
    std::string kill_reason;
    std::deque<WorkerJob> serving;  // frames read, in order; loads move to `loads` when reached
    std::deque<WorkerJob> loads;
    uint64_t serving_job = 0;       // running (its in-flight marker is taken); 0: idle
    uint64_t load_job = 0;
    uint32_t load_model = 0;
    std::string load_name;  // of a file load; empty for an attach or unload on the load thread
    std::map<uint32_t, Engine> engines;  // by model index
    std::set<uint64_t> cancelled;        // generations the supervisor cancelled (WorkerCancel)
    // Frames for the worker: the supervisor's channel writes them in order; a frame waiting
    // behind others is written (and its handles looked up) only when its turn comes.
    uint32_t unwritten = 0;
    uint64_t last_delivery_ms = 0;
    // Messages for the supervisor, in order, with when each was written.
    struct ToCore {
      v1::WorkerEnvelope message;
      std::vector<int> handles;
      uint64_t sent_ms = 0;
    };
    std::deque<ToCore> to_core;
    uint64_t last_reply_ms = 0;
    // Nothing of the process before (its jobs, engines, frames either way) is left.
    void ForgetProcess() {
      kill_reason.clear();
      serving.clear();
      loads.clear();
      engines.clear();
      cancelled.clear();
      serving_job = load_job = 0;
      unwritten = 0;
      to_core.clear();
    }
  };
  struct Pending {
    enum class Kind { kInfer, kLoad, kRegion, kGenerate, kEmbed, kOther } kind = Kind::kOther;
    bool stream = false;          // generate: chunks asked for
    uint32_t chunks_sent = 0;     // generate: chunks the core emitted (their indices count up)
    uint32_t chunks_seen = 0;     // generate: chunks the client read ...
    uint32_t tokens_seen = 0;     // ... their tokens (one a chunk, but for a tail of text alone) ...
    bool tail_seen = false;       // ... and whether a chunk of text alone came: nothing may follow it
    bool in_region = false;    // infer: its input lies in a region (no token to check)
    bool typed = false;        // infer: sent as a typed tensor (InferRequest.inputs)
    int handle = -1;           // a region's memfd, sent with the request
    std::string model;
    uint64_t sent_ms = 0;
    uint64_t deadline_ms = 0;  // infer: 0 = the daemon's default
    uint32_t token = 0;
    uint64_t bytes = 0;
    bool accepted = false;     // handed to the core
    // infer: the version of its file that the registry held when the core took the request; the
    // answer must come from it or a later one (a reload that saw a new version stops the old).
    uint32_t min_version = 0;
    bool replied = false;      // the core emitted its reply (on its way)
  };
  static constexpr uint64_t kRegionBytes = 64 * 1024;
  struct Client {
    uint32_t index = 0;
    uint64_t session = 0;
    bool connected = false;
    bool admin = true;
    uint64_t next_request = 1;
    std::map<uint64_t, Pending> outstanding;
    uint64_t last_delivery_ms = 0;
    // A greedy client pipelines large inputs and never reads its replies.
    bool greedy = false;
    std::vector<uint64_t> regions;  // registered shared-memory regions (ids), kRegionBytes each
  };

  // Scheduling. What is scheduled belongs to the supervisor running now, and is dropped should it
  // die first (its workers, its sockets, its timers), unless it `outlives` it (clients, the world).
  void At(uint64_t time, std::function<void()> fn, bool outlives = false);
  void After(uint64_t delay, std::function<void()> fn, bool outlives = false) {
    At(now_ + delay, std::move(fn), outlives);
  }
  supervisor::Time Now() const;
  void Deliver(supervisor::Event event, const std::string& what);
  void RunPendingEvents();
  void Execute(supervisor::Action& action);
  void Trace(const std::string& line);
  void Fail(const std::string& what);

  // World set-up.
  void MakeWorld();
  supervisor::Config MakeConfig() const;
  std::vector<supervisor::ModelEntry> Registry() const;
  void NoteRegisteredVersions();

  // Workers (workers.cc).
  void Spawn(uint32_t slot, uint32_t generation);
  const SimFile* FileOf(const std::string& name, const std::string& path) const;
  void SendToWorker(uint32_t slot, std::string frame, std::vector<int> handles);
  void WriteFrame(uint32_t slot, uint32_t generation, v1::WorkerEnvelope message,
                  const std::vector<int>& handles);
  void WorkerReads(uint32_t slot, uint32_t generation, v1::WorkerEnvelope message, std::vector<int> regions);
  void StartServing(Worker& w);
  void StartLoad(Worker& w);
  // Whether the worker has a job of this model on its load thread, running or queued.
  bool OnLoadThread(const Worker& w, uint32_t model) const;
  void FinishJob(uint32_t slot, uint32_t generation, uint64_t job, bool load_thread,
                 WorkerJob work);
  void ReplyToCore(Worker& w, v1::WorkerEnvelope message, std::vector<int> regions = {});
  void DeliverToCore(uint32_t slot, uint32_t generation);
  // fatal: it exits with status 2 (fatal configuration) and is never started again.
  void Kill(uint32_t slot, const std::string& reason, bool fatal = false);
  void Die(uint32_t slot, uint32_t generation, const std::string& why, bool fatal);
  // Decides how a job goes: its duration, or that the worker dies (or hangs) in the middle of it.
  void Schedule(Worker& w, uint64_t job, bool load_thread, WorkerJob work);
  v1::WorkerEnvelope RunJob(Worker& w, const WorkerJob& work, std::vector<int>& regions_out);
  // RunJob's kinds (sim/jobs.cc).
  v1::WorkerEnvelope RunLoad(Worker& w, const WorkerJob& work, std::vector<int>& regions_out);
  v1::WorkerEnvelope RunAttach(Worker& w, const WorkerJob& work, std::vector<int>& regions_out);
  v1::WorkerEnvelope RunTypedInfer(Worker& w, const WorkerJob& work, std::vector<int>& regions_out);
  v1::WorkerEnvelope RunInfer(Worker& w, const WorkerJob& work, std::vector<int>& regions_out);
  v1::WorkerEnvelope RunUnload(Worker& w, const WorkerJob& work, std::vector<int>& regions_out);
  v1::WorkerEnvelope RunPark(Worker& w, const WorkerJob& work, std::vector<int>& regions_out);
  int NewSupervisorHandle(const Region& region);
  void CheckParkedCache(const Worker& w, const v1::WorkerAttach& a, const Region& weights, int cache);
  // A language model's engine hands its KV cache to the supervisor with a load or attach reply.
  // sim/kv_regions.cc. A load's KV cache region: returns whether it is device memory.
  bool ShareCache(const Worker& w, const Region& weights, v1::WorkerLoadDone& done, std::vector<int>& out);
  // A retried generation's KV source (false: the run has failed).
  bool CheckKvSource(uint32_t slot, const v1::WorkerEnvelope& message, const std::vector<int>& handles);
  // A park's host copy of a device KV cache, after the weights' copy.
  void CopyCacheToPark(const Worker& w, const Engine& e, uint32_t model, v1::WorkerParkDone& done,
                       std::vector<int>& out);

  // Clients (clients.cc).
  void ClientAct(uint32_t index);
  void SendRequest(Client& c, v1::Envelope request, Pending pending);
  void ClientReceives(uint64_t session, const v1::Envelope& reply);
  void CheckInferReply(const Pending& p, const v1::Envelope& reply);
  // Generations (generate.cc): a client's request, the core's chunks and final reply checked as
  // they are emitted and read (in order, none after the final), a worker that streams its text a
  // step at a time, crashing, hanging or cancelled between steps.
  void ClientGenerates(Client& c);
  void CheckChunkSent(Pending& p, const v1::Envelope& chunk);
  void CheckGenerateReply(Pending& p, const v1::Envelope& reply, bool final);
  void CheckEmbedReply(const Pending& p, const v1::Envelope& reply);
  void CheckGeneratedText(const Pending& p, const std::string& text);
  void StartGeneration(Worker& w, uint64_t job, WorkerJob work);
  void GenerationStep(uint32_t slot, uint32_t generation, uint64_t job, uint32_t step, WorkerJob work);
  std::string PickModel();

  // The world outside (files, reloads, operators).
  void EnvironmentAct();
  void Tick();

  // Restarts of the supervisor (restart.cc).
  // A handle the core closes leaves the store first (WarmStore::Forget).
  void ForgetStored(int handle);
  // After every tick: a model that joined or left what is worth keeping is in the store within
  // kKeptSyncMs of ticks, or the core has written the store within that time (under churn).
  void CheckStoreKeepsUp();
  // Whether the store holds what Core::Kept says now. Checked after every event while the store
  // is behind: a difference that ends between two ticks (a model joins and leaves again, a paused
  // supervisor's first events) is over, and the next one is counted from its own start.
  bool StoreHoldsKept() const;
  // Memory kept for reuse (kept_memory.cc): an offer to a job, a region dropped, and after every
  // event that the shell keeps exactly what the core counts.
  bool OfferKept(const supervisor::action::SendToWorker& send);
  void DropKept(int handle);
  void CheckKeptMemory();
  // KV pages (sim/kv_pages.cc): a language engine's pool; a generation's cache opened with its
  // prompt (and the tokens it resumes after), grown by its steps, closed at its end; the usage
  // the worker reports; and the pages' invariants, checked after every event.
  std::shared_ptr<KvPages> NewKvPages();
  void OpenKvSequence(Engine& e, uint64_t job, const v1::WorkerInfer& infer);
  void StepKvSequence(Engine& e, uint64_t job, uint32_t step);
  static void CloseKvSequence(Engine& e, uint64_t job);
  // The blocks a generation holds once its next step is done: what a preempted one needs to go on.
  uint32_t KvBlocksToGoOn(const Engine& e, uint64_t job) const;
  // Whether this step of the generation is where its engine preempts it for others (generate.cc).
  bool PreemptsFor(const Worker& w, const v1::WorkerInfer& infer, uint32_t step);
  // A generation arriving at a worker, admitted by the blocks it may come to need, as the engine
  // admits one: false when refused (its answer, kv_full, is sent).
  bool AdmitKvSequence(Worker& w, const WorkerJob& work);
  static void ReportKvUsage(const Engine& e, v1::KvUsage* usage);
  void CheckKvPages();
  // SIGKILL of the supervisor: its workers, connections and descriptors go with it, but for what
  // the store holds; the next one starts from the store, its configuration's budgets maybe changed.
  void RestartSupervisor();
  // What the new core adopted is the current version of its own model's file.
  void CheckAdopted();
  void StartCore(std::vector<supervisor::KeptWeights> kept);

  // The supervisor paused (pause.cc): a SIGSTOP, a VM stall. The world goes on; nothing reaches
  // the core until it resumes, and then the tick comes before what was sent meanwhile.
  void Pause(uint64_t ms);
  void Resume();
  // While paused, keeps fn for the first poll for I/O after the pause (true); else false.
  bool Hold(std::function<void()> fn);
  // fn as a delivery to the supervisor: held while it is paused.
  std::function<void()> Reading(std::function<void()> fn);
  // Judgements on fresh information (pause.cc): what workers were sent and when they answered.
  void NoteInferSent(uint32_t slot, const v1::WorkerEnvelope& message);
  void NoteReplySent(const v1::WorkerEnvelope& reply);
  void ForgetInfers(uint32_t slot, uint32_t generation);
  // The device's memory is gone: the core believes nothing its workers say from now on, answers
  // written before included (they may have been computed from dead memory).
  void DisbelieveDevice(uint32_t device);
  void CheckKill(uint32_t slot, const std::string& reason);
  void CheckDeadlineReply(uint64_t session, const v1::Envelope& reply);
  // How far the shell has read (event::Tick): the time of the oldest message a worker wrote, or
  // request a client sent, that has not reached the core; now when there is none.
  uint64_t WorkersReadThrough() const;
  uint64_t ClientsReadThrough() const;

  // Checks (checks.cc).
  void CheckAfterEvent();
  void CheckPeriodic();
  // Whether the device of worker `w` has room to move one of the models it holds to another worker.
  bool RoomToMoveFrom(const Worker& w) const;
  void CheckFinal();

  Options options_;
  Rng rng_;
  Outcome outcome_;
  uint64_t now_ = 0;
  uint64_t seq_ = 0;
  uint64_t life_ = 1;  // which supervisor runs: one more at each restart
  struct Scheduled {
    uint64_t time;
    uint64_t seq;
    uint64_t life;  // 0: outlives the supervisor
    std::function<void()> fn;
    bool operator>(const Scheduled& o) const { return time != o.time ? time > o.time : seq > o.seq; }
  };
  std::priority_queue<Scheduled, std::vector<Scheduled>, std::greater<>> queue_;
  std::deque<std::string> trace_;
  bool failed_ = false;
  bool stopping_ = false;
  bool workers_stopped_ = false;
  bool stop_workers_sent_ = false;

  // The core and what it runs on.
  supervisor::Config config_;
  std::vector<std::byte> segment_bytes_;
  shm::SegmentView segment_;
  std::unique_ptr<supervisor::Core> core_;
  // Events the shell would hand to the core right after the current batch (WorkerSpawned).
  std::vector<std::function<void()>> pending_events_;

  // Chaos levels of this seed (per mille).
  uint32_t crash_per_mille_ = 0;
  uint32_t hang_per_mille_ = 0;
  uint32_t slow_per_mille_ = 0;
  uint32_t congestion_per_mille_ = 0;
  uint64_t largest_model_ = 0;  // bytes a device needs for the largest model and its workspace
  // How many of the configured models the clients use in this seed (few: placement matters).
  uint32_t models_in_use_ = 5;
  // Calm seeds: clients only infer and read (nothing unloads or loads by hand), so that what the
  // daemon decides on its own (placement, keep_alive) shows.
  bool calm_ = false;

  std::vector<SimFile> files_;
  std::vector<bool> configured_;     // by file: listed in the configuration now
  std::vector<uint32_t> registered_version_;  // by file: the version the last start or reload saw
  std::vector<Worker> workers_;
  std::vector<Client> clients_;
  uint64_t next_session_ = 1;
  std::set<uint64_t> gone_sessions_;  // told to the core as gone
  uint32_t next_token_ = 1;
  int next_pid_ = 1000;

  // Handles: every region a handle names, and which of them the supervisor holds open.
  int next_handle_ = 100;
  std::map<int, Region> regions_;
  std::set<int> supervisor_handles_;
  // Memory the shell keeps for reuse (action::CloseHandle::keep) until an offer or a DropKept: the
  // core must count exactly these (core/kept_memory.h).
  std::set<int> kept_handles_;
  std::set<int> lost_handles_;  // device regions whose owner died: never to be attached again
  std::vector<bool> devices_gone_;       // lost for good (their owner cannot run)
  std::vector<uint32_t> device_epochs_;  // losses so far: a restore is for the latest one
  std::vector<bool> devices_down_;       // lost and not (yet) restored
  // The service manager's descriptor store, as the shell last wrote it (action::StoreKept).
  std::vector<supervisor::KeptWeights> stored_;
  uint32_t ticks_since_stored_ = 0;
  uint32_t ticks_store_behind_ = 0;  // ticks since what the store holds differs from Core::Kept
  // File loads running now, per model name.
  std::map<std::string, int> loads_running_;
  // Tokens of infer requests by session, to tell whose request a worker runs.
  std::map<uint32_t, uint64_t> token_session_;
  // Pauses of the supervisor (pause.cc).
  bool paused_ = false;
  bool tick_missed_ = false;  // a tick came due while paused
  uint64_t resumed_ms_ = 0;
  std::vector<std::function<void()>> held_;
  struct SentInfer {
    uint32_t slot = 0;
    uint32_t generation = 0;
    uint32_t token = 0;
    uint64_t deadline_ms = 0;  // monotonic; 0: none
    uint64_t replied_ms = UINT64_MAX;
    // Sent with its deadline already upon it (a request whose model came late: the core tells the
    // worker "now"): its request's own deadline passed before it was sent, so an answer in the
    // same millisecond is not "in time".
    bool due_when_sent = false;
  };
  std::map<uint64_t, SentInfer> sent_infers_;    // by job, until answered in time or its worker died
  std::map<uint32_t, uint64_t> in_time_tokens_;  // requests a worker answered before the deadline
  std::map<uint64_t, uint32_t> job_tokens_;      // every infer job sent: its request's token
  // The stack check: since when a worker has idled while another holds several models.
  uint64_t stacked_since_ms_ = 0;
  uint64_t starved_since_ms_ = 0;
};

}  // namespace warmpool::sim
