// Every structure of the shared-memory segment, in one header. They are fixed-width, standard-layout
// PODs linked by uint32_t indices, never pointers: workers are exec'd, so the segment maps at a
// different address in every process. Fields that another process reads concurrently are accessed
// through std::atomic_ref (the structs themselves stay trivially copyable).
//
// Writers: the supervisor is the only writer of the header, the model index, the LRU links and the
// worker table; readers copy a record under its seqlock. A worker writes only in-flight slots it
// took itself, with compare-and-swap. No mutex lives in the segment: a worker killed while holding
// one would freeze every other process (Boost.Interprocess mutexes are not robust).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace warmpool::shm {

// Bump on any change below; the layout test pins the string so an accidental change fails CI.
inline constexpr uint32_t kLayoutVersion = 6;
inline constexpr char kLayoutString[] =
    "warmpool-shm-v6:hdr256:model512:worker128:inflight32:park:starttime:held16:changes:budgets8:"
    "stats64+1664";
inline constexpr char kMagic[8] = {'W', 'A', 'R', 'M', 'P', 'O', 'O', 'L'};
inline constexpr uint32_t kNil = 0xFFFFFFFFu;
inline constexpr uint32_t kMaxDevices = 8;

enum class ModelState : uint32_t {
  kEmpty = 0,       // record unused
  kRegistered = 1,  // known, not resident anywhere
  kLoading = 2,
  kReady = 3,
  kParked = 4,
  kFailed = 5,
  kUnloading = 6,
};

enum class WorkerState : uint32_t {
  kEmpty = 0,
  kStarting = 1,
  kIdle = 2,
  kBusy = 3,
  kDead = 4,   // exited; waiting for respawn
  kFatal = 5,  // exited with status 2: not respawned
};

struct SegmentHeader {
  char magic[8];
  uint32_t layout_version;
  uint32_t header_size;       // sizeof(SegmentHeader)
  uint64_t segment_size;
  uint32_t max_models;
  uint32_t max_workers;
  uint32_t max_inflight;
  uint32_t device_count;
  uint64_t models_offset;     // byte offsets from the segment start
  uint64_t workers_offset;
  uint64_t inflight_offset;
  int64_t supervisor_pid;
  uint32_t seq;               // seqlock over the LRU ends and the device accounts
  uint32_t lru_head;          // least recently used
  uint32_t lru_tail;          // most recently used
  uint32_t lru_length;
  uint64_t park_used_bytes;    // host copies of parked models; equals the sum over parked records
  uint64_t park_budget_bytes;  // 0: parking disabled
  // When the supervisor process started (clock ticks since boot, /proc/PID/stat field 22): with
  // the pid, it tells a live supervisor from a new process that reused the pid.
  uint64_t supervisor_start_ticks;
  // The writer's batches: odd while the supervisor changes several records that belong together
  // (one event's worth), even between. An observer reads everything between two equal even
  // values for a snapshot in which the accounts and the records agree.
  uint64_t changes;
  // Per device (the first device_count are used): accounted bytes, which equal the sum over the
  // device's resident records, and the budget (0 = unlimited). Devices differ (free memory at
  // start less the reserve), so each has its own.
  uint64_t device_used_bytes[kMaxDevices];
  uint64_t device_budget_bytes[kMaxDevices];
  // shm/stats.h: one PoolStats, then max_models ModelStats (index = model record's index).
  uint64_t stats_offset;
};

struct ModelRecord {
  uint32_t seq;               // seqlock: odd while the supervisor writes
  uint32_t state;             // ModelState
  char name[64];              // NUL-terminated
  char engine[16];
  char path[256];
  uint64_t weight_bytes;      // accounted on device while loading/ready/unloading
  uint64_t workspace_bytes;   // parked: the KV cache kept with the copy (counted against the park budget)
  uint64_t loaded_bytes;      // load progress
  uint32_t device;
  uint32_t worker_slot;       // kNil when not resident
  uint32_t inflight;          // requests dispatched and not yet answered
  uint32_t pinned;
  uint32_t replicas;
  uint32_t in_lru;            // 1 while linked into the LRU list
  uint32_t lru_prev;
  uint32_t lru_next;
  uint64_t last_used_ns;      // CLOCK_REALTIME of the end of the last request
  uint64_t hits;
  uint64_t loads;
  uint64_t evictions;
  uint64_t failures;
  char last_error[72];
};

inline constexpr uint32_t kWorkerModelsShown = 16;

struct WorkerRecord {
  uint32_t seq;
  uint32_t state;             // WorkerState; busy while jobs are outstanding
  int32_t pid;
  uint32_t generation;        // bumped at every spawn of this slot; never 0 for a live worker
  uint32_t device;
  uint32_t restarts;
  int32_t last_exit;          // exit status of the last death (128 + signal), -1 if none
  uint32_t models;            // models this worker serves, loads or attaches
  uint64_t started_ns;        // CLOCK_REALTIME of the spawn
  uint64_t served;            // jobs it answered
  uint32_t outstanding;       // jobs sent to it and not answered
  uint32_t reserved0;
  uint32_t held[kWorkerModelsShown];  // the first of those models (indices; kNil-filled)
  uint64_t reserved[1];
};

// tag = generation << 32 | worker_slot << 16 | state. 0 = free.
struct InflightSlot {
  uint64_t tag;
  uint64_t request_id;
  uint32_t model;
  uint32_t reserved;
  uint64_t started_ns;
};

enum class SlotState : uint16_t { kFree = 0, kTaken = 1 };

constexpr uint64_t MakeTag(uint32_t generation, uint16_t worker_slot, SlotState state) {
  return (static_cast<uint64_t>(generation) << 32) | (static_cast<uint64_t>(worker_slot) << 16) |
         static_cast<uint64_t>(state);
}
constexpr uint32_t TagGeneration(uint64_t tag) { return static_cast<uint32_t>(tag >> 32); }
constexpr uint16_t TagWorker(uint64_t tag) { return static_cast<uint16_t>(tag >> 16); }
constexpr SlotState TagState(uint64_t tag) { return static_cast<SlotState>(tag & 0xFFFF); }

template <typename T>
constexpr bool kPod = std::is_standard_layout_v<T> && std::is_trivially_copyable_v<T>;
static_assert(kPod<SegmentHeader> && kPod<ModelRecord> && kPod<WorkerRecord> && kPod<InflightSlot>);
static_assert(sizeof(SegmentHeader) == 256);
static_assert(offsetof(SegmentHeader, layout_version) == 8);
static_assert(offsetof(SegmentHeader, segment_size) == 16);
static_assert(offsetof(SegmentHeader, supervisor_pid) == 64);  // read across versions
static_assert(offsetof(SegmentHeader, seq) == 72);
static_assert(offsetof(SegmentHeader, park_used_bytes) == 88);
static_assert(offsetof(SegmentHeader, device_used_bytes) == 120);
static_assert(offsetof(SegmentHeader, device_budget_bytes) == 184);
static_assert(offsetof(SegmentHeader, stats_offset) == 248);
static_assert(sizeof(ModelRecord) == 512);
static_assert(offsetof(ModelRecord, name) == 8);
static_assert(offsetof(ModelRecord, weight_bytes) == 344);
static_assert(offsetof(ModelRecord, last_error) == 440);
static_assert(offsetof(SegmentHeader, supervisor_start_ticks) == 104);
static_assert(offsetof(SegmentHeader, changes) == 112);
static_assert(sizeof(WorkerRecord) == 128);
static_assert(offsetof(WorkerRecord, outstanding) == 48);
static_assert(offsetof(WorkerRecord, held) == 56);
static_assert(sizeof(InflightSlot) == 32);
static_assert(offsetof(InflightSlot, request_id) == 8);

struct Limits {
  uint32_t max_models = 256;
  uint32_t max_workers = 16;
  uint32_t max_inflight = 1024;
};

// Bytes of a segment for the given limits (regions 64-byte aligned).
uint64_t SegmentSize(const Limits& limits);

}  // namespace warmpool::shm
