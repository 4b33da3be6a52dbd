// What the core keeps of each request, job, model, session and worker (supervisor/core/core.h):
// plain records, with no behaviour of their own; the core's files change them. Here so that core.h
// is the core's interface and its decisions' index, not its data.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/file_version.h"
#include "common/status.h"
#include "ipc/warmpool.pb.h"
#include "ipc/worker.pb.h"
#include "shm/layout.h"
#include "supervisor/core/model.h"
#include "supervisor/core/model_entry.h"
#include "supervisor/policy/retry.h"

namespace warmpool::supervisor::records {

// Who to answer, and what the request holds of the budgets.
struct Call {
  uint64_t session = 0;
  uint64_t request_id = 0;
  uint64_t bytes = 0;
  uint64_t accepted_ms = 0;  // when the request came in (queue wait, shm/stats.h)
};
// What an infer request holds in the frame: its matrix, or its typed tensors.
inline uint64_t RequestDataBytes(const v1::InferRequest& r) {
  return r.inputs_size() > 0 ? r.ByteSizeLong() : r.input().data().size();
}

// A request waiting for its model to be loaded, for room to load it, or for room in a worker.
struct Waiter {
  Call call;
  bool is_infer = false;
  v1::InferRequest infer;
  uint64_t deadline_ms = 0;  // monotonic; 0 = none
  uint32_t crashes = 0;      // workers that died while running this very request, alone
  // ... and while it ran beside other jobs (in one batch, beside a load): it may be innocent
  uint32_t shared_crashes = 0;
  // Sent to a worker that died before answering: runs again, one at a time per worker (below).
  bool retry = false;
  uint32_t replicas_asked = 0;  // a load: LoadRequest.replicas, for its reply
  std::optional<v1::GenerateRequest> generate{};  // a generation instead of `infer` (core/generate.cc)
  std::optional<v1::EmbedRequest> embed{};        // embeddings instead of `infer` (core/embed.cc)
  // A generation resumed after its worker died mid-stream: the chunks and tokens its client has.
  uint32_t chunks = 0;
  std::vector<int32_t> sent_tokens{};
  uint64_t resume_epoch = 0;  // of the model it began on: it goes on only on that registration ...
  FileVersion resume_version{};  // ... and those weights
  // A generation retried after its worker died: that replica's KV cache region (Core::kv_sources_),
  // whose keys and values of its prompt and tokens sent the engine copies; -1: none.
  int kv_source = -1;
  // A generation a replica's KV cache had no room for (Core::RequeueKvRefused): the blocks it may
  // need, as that engine said (it goes only where that many are free: Core::WithKvRoom; 0: one
  // handed back behind such, never tried), and when it was first sent back (they wait in that
  // order). refused_as 0: never sent back.
  uint64_t kv_blocks = 0;
  uint64_t refused_as = 0;
  // A new generation's prompt, by its prefixes (PrefixKeys): it prefers the replica an earlier
  // prompt that began so went to, whose prefix cache may hold that beginning.
  std::vector<uint64_t> prefix_keys{};
};
struct Job {
  enum class Kind { kLoad, kAttach, kUnpark, kInfer, kUnload, kPark };
  Kind kind = Kind::kInfer;
  uint32_t worker = 0;
  uint32_t model = 0;
  uint64_t epoch = 0;         // of the model's registration: a reply for an older one is stale
  Call call{};                // infer
  bool answered = false;
  uint64_t deadline_ms = 0;   // infer: the request's deadline
  uint64_t started_ms = 0;
  uint64_t progress_ms = 0;   // last sign of progress
  uint64_t frame_bytes = 0;   // in the worker's channel
  uint32_t crashes = 0;
  uint32_t shared_crashes = 0;
  bool retry = false;  // infer: a Waiter::retry
  uint64_t refused_as = 0;  // a generation: its Waiter::refused_as
  v1::InferRequest request{};  // infer: kept to retry on another worker if this one dies
  std::optional<v1::GenerateRequest> generate{};  // a generation (core/generate.cc), kept alike
  std::optional<v1::EmbedRequest> embed{};        // embeddings (core/embed.cc), kept alike
  // Judged by its steps, not by a default deadline: the worker sends heartbeats between them (one
  // that says nothing for load_stall_ms is taken for hung), and a client that leaves cancels it.
  // A generation, embeddings, typed tensors (whose runs may be a long prompt's pieces).
  bool stepwise = false;
  uint32_t chunks = 0;  // a generation's chunks sent to its client ...
  bool resumed = false;  // ... some of them before this job began (it goes on after them)
  std::vector<int32_t> sent_tokens{};  // ... and their tokens: where it resumes if its worker dies
  // Whether it can resume after its worker's death: a stream without tools whose every chunk sent
  // carried its tokens (a chunk of text alone, an engine's held-back tail, would be sent again).
  bool resumable = false;
  int kv_source = -1;  // a Waiter::kv_source, until the generation's first chunk (the engine read it)
  std::vector<uint64_t> faults{};  // faults granted to this job (fault injection)
  uint32_t moving_from = shm::kNil;  // attach: a move; that replica leaves once this one serves
  // Runs on the worker's load thread: loads, attaches and unparks, and an unload of a model
  // with one of those still before it there (the worker keeps one model's jobs in order).
  bool load_thread = false;
};
struct Model {
  uint64_t epoch = 0;
  ModelEntry entry;  // as registered; updated when a load finds the file changed
  ModelMachine machine;
  std::deque<Waiter> waiters;
  std::vector<Call> unload_waiters;
  std::vector<uint64_t> bulk;  // `unload --all` requests waiting for this model
  uint32_t inflight = 0;
  policy::CrashRecord crashes;
  std::string last_error;  // in full (the segment keeps a truncated copy)
  bool file_broken = false;  // last_error is about its file (Core::MarkFailed)
  // Models released to make room for its load or its replicas, told in the next load reply.
  std::vector<std::string> evicted_for;
  int64_t keep_alive_ms = -1;
  // A request (infer, load) has named it since it was registered: keep_alive 0 releases a model
  // when its requests end, so a preloaded or adopted one that nobody has asked for yet stays.
  bool asked = false;
  std::optional<int64_t> keep_alive_override_ms;
  uint64_t expires_at_ms = 0;
  uint32_t target_replicas = 1;
  uint32_t max_batch_delay_us = 0;  // dynamic batching (Config::max_batch_delay_us)
  // Language models: generations each replica runs at once ([[models]] parallel; 0: the engine's
  // default, what registration counted: registered_sequences).
  uint32_t parallel = 0;
  uint32_t registered_sequences = 0;
  uint64_t kv_cache_tokens = 0;  // [[models]] kv_cache_tokens; 0: every generation's whole context
  // What ApplySettings last made of them for the entry (kv_cache_tokens clamped): once a load has
  // reported the engine's own figures (a cache of whole blocks, say), the same
  // settings applied again leave them alone.
  uint32_t sequences_applied = 0;
  uint64_t kv_cache_tokens_applied = 0;
  // Its calls of tools are read in this format ("" none): [[models]] tool_call_format, else what
  // its chat template shows (ModelEntry::tool_call_format).
  std::string tool_call_format;
  bool pinned = false;
  bool registered_by_client = false;  // `warmpool register`: a reload leaves it alone
  Status refused;  // its path was refused at registration: requests get this, no worker loads it
  // Leaving the registry (a reload, `register --remove`) or changing: `retiring` set; the inner
  // value is what replaces it once it is idle and not resident (empty: it is forgotten).
  std::optional<std::optional<ModelEntry>> retiring;
  // A new version replaces it: nothing more of the old one is started (no load, attach,
  // replica, move or dispatch); requests wait until ProcessRetirements registers the new one.
  bool changing() const { return retiring.has_value() && retiring->has_value(); }
};
// A client's shared memory (RegionRequest): its memfd, and how much of it tensors may use.
struct ClientRegion {
  int handle = -1;
  uint64_t bytes = 0;
};
struct Session {
  uint32_t outstanding = 0;
  uint64_t held_bytes = 0;
  std::unordered_map<uint64_t, ClientRegion> regions;
};
struct WorkerSlot {
  enum class State { kDown, kStarting, kUp, kFatal };
  State state = State::kDown;
  uint32_t generation = 0;
  int pid = 0;
  uint32_t restarts = 0;
  int32_t last_exit_code = -1;
  std::string last_exit;
  uint64_t started_ms = 0;
  uint64_t started_unix_ns = 0;  // for the segment's record
  uint64_t respawn_at_ms = 0;
  uint64_t backoff_ms = 0;
  bool killing = false;
  // Killed because its device's memory died (event::DeviceLost): what it says from then on is
  // not believed, and its death is no model's fault.
  bool device_lost = false;
  uint32_t outstanding = 0;
  uint64_t pending_bytes = 0;
  uint32_t retries = 0;  // of the outstanding jobs, retried requests (at most one: DrainReady)
  uint64_t load_done_ms = 0;     // when it last finished a load
  uint64_t serving_done_ms = 0;  // ... anything on its serving thread
  uint64_t served = 0;
};
struct ArmedFault {
  v1::Fault fault;
  uint32_t remaining = 1;  // shots not granted yet
  uint32_t granted = 0;    // granted to jobs not finished
  uint32_t matched = 0;    // matching jobs seen (for `after`)
};
struct BulkUnload {
  Call call;
  uint32_t remaining = 0;
  uint32_t parked = 0;
  uint32_t total = 0;
};

}  // namespace warmpool::supervisor::records
