// Counters and histograms of the pool, in the segment beside the records they describe, so that
// observers (`GET /metrics`, `warmpool top`) read them without asking the daemon anything.
//
// One writer (the supervisor's loop thread; the core and the shell both write from it), any number
// of readers in other processes: every field is a 64-bit word written with a relaxed atomic store
// and read with a relaxed atomic load. A reader may see a histogram's count one observation ahead
// of its buckets; it never sees a torn word. Counters only grow while a model keeps its record:
// when a record goes to another model (ModelIndex::Register of a new name) its stats are zeroed
// and `generation` changes, which tells a reader computing rates to start over.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace warmpool::shm {

// One set of bucket bounds for every histogram (seconds, upper bounds, `le` in Prometheus terms):
// from a cached inference (half a millisecond) to a load from a slow disk (two minutes).
inline constexpr uint32_t kHistogramBuckets = 18;  // the last is +Inf
inline constexpr double kBucketBoundsSeconds[kHistogramBuckets - 1] = {
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
    0.5,    1,     2.5,    5,     10,   30,    60,   120};

// Bucket counts are per bucket (not cumulative); sum in nanoseconds.
struct Histogram {
  uint64_t buckets[kHistogramBuckets];
  uint64_t count;
  uint64_t sum_ns;
};

// What a request asked (Envelope body) and how it was answered (v1::Code, 0..8).
enum class RequestKind : uint32_t { kInfer, kLoad, kUnload, kPin, kRegister, kGenerate, kEmbed, kCount };
inline constexpr uint32_t kCodes = 9;
// Where a load's weights came from.
enum class LoadSource : uint32_t { kFile, kAttach, kUnpark, kCount };
// Why a resident model (or one replica of it) was let go.
enum class ReleaseReason : uint32_t {
  kBudget,        // evicted to make room on its device
  kCapacity,      // evicted for a slot: [limits] max_loaded_models or the park budget
  kKeepAlive,     // its keep_alive ran out
  kSingleActive,  // [pool] single_active: another model was asked for
  kExplicit,      // `warmpool unload` (one model or --all)
  kReload,        // a reload or `warmpool register` changed or removed it
  kFailure,       // its worker crashed, its device was lost, an attach failed, it overran its size
  kCount,
};
// Why a worker process was started again.
enum class RestartReason : uint32_t {
  kCrashed,     // it died by a signal or exited by itself
  kKilled,      // the supervisor killed it: a stalled job, a deadline, a device lost
  kCount,
};

struct ModelStats {
  uint64_t generation;  // bumped when the record is reset for another model
  uint64_t requests[static_cast<uint32_t>(RequestKind::kCount)][kCodes];
  uint64_t loads[static_cast<uint32_t>(LoadSource::kCount)];
  uint64_t releases[static_cast<uint32_t>(ReleaseReason::kCount)];
  uint64_t crashes_charged;  // worker deaths blamed on this model (policy::ChargeCrash)
  // Language models (the core writes these). Counters: the prompt and generated tokens of
  // generations that ended (and of the prompts', those found in the prefix cache); generations stopped because their client left. Gauges: generations
  // and embeddings running on workers, requests waiting for the model, the sequences its replicas
  // hold at once (one KV cache of the whole context each, as admission counts them), the generations among those
  // running (each in one of those sequences).
  uint64_t prompt_tokens;
  uint64_t generation_tokens;
  uint64_t generations_cancelled;
  uint64_t sequences_running;
  uint64_t requests_waiting;
  uint64_t sequences_held;
  uint64_t generations_running;
  uint64_t prompt_tokens_cached;  // counter: of prompt_tokens, those found in the prefix cache
  // Gauges: the KV cache blocks its serving replicas' engines last said their sequences hold, of
  // all they have (0 of 0: none said; engine ABI version 10, kv_usage).
  uint64_t kv_blocks_held;
  uint64_t kv_blocks;
  // Counter: generations a replica's engine had no room for in its KV cache beside those it ran
  // (engine ABI version 12), sent back to wait in the queue.
  uint64_t kv_cache_waits;
  // Counter: of those, generations its engine preempted mid-way for others' room (version 13).
  uint64_t kv_cache_preemptions;
  uint64_t reserved[1];  // to a multiple of 64 bytes
  Histogram infer_seconds;  // request received to reply queued (the daemon's whole share)
  Histogram queue_seconds;  // infer request received to its dispatch to a worker
  Histogram load_seconds;   // a load or attach job, sent to done
  Histogram unpark_seconds; // an unpark job, sent to done
  // Generations: request received to its first token (the core's millisecond clock for the wait,
  // the worker's for the rest); and the mean time per output token after the first, once per
  // generation of two tokens or more.
  Histogram first_token_seconds;
  Histogram time_per_output_token_seconds;
};

struct PoolStats {
  uint64_t restarts[static_cast<uint32_t>(RestartReason::kCount)];
  uint64_t queued;    // gauge: requests waiting in the daemon (for a load, room, or a worker)
  uint64_t inflight;  // gauge: requests accepted and not yet answered
  uint64_t started_unix_ns;
  uint64_t reserved[3];
};

static_assert(std::is_standard_layout_v<ModelStats> && std::is_trivially_copyable_v<ModelStats>);
static_assert(std::is_standard_layout_v<PoolStats> && std::is_trivially_copyable_v<PoolStats>);
static_assert(sizeof(Histogram) == 160);
static_assert(sizeof(ModelStats) == 1664);
static_assert(sizeof(PoolStats) == 64);

// The single writer's operations and the readers' loads.
inline uint64_t StatLoad(const uint64_t& word) {
  return std::atomic_ref<uint64_t>(const_cast<uint64_t&>(word)).load(std::memory_order_relaxed);
}
inline void StatStore(uint64_t& word, uint64_t value) {
  std::atomic_ref<uint64_t>(word).store(value, std::memory_order_relaxed);
}
inline void StatAdd(uint64_t& word, uint64_t delta = 1) { StatStore(word, StatLoad(word) + delta); }
// The bucket an observation of `ns` falls in.
uint32_t BucketOf(uint64_t ns);
void Observe(Histogram& histogram, uint64_t ns);
// A reader's copy of a histogram, word by word.
Histogram LoadHistogram(const Histogram& histogram);
// Estimated quantile q (0..1) of the observations in `delta` (bucket counts), interpolated
// linearly within the bucket as Prometheus's histogram_quantile does; 0 when empty. Seconds.
double Quantile(const Histogram& delta, double q);
// b - a, per bucket (a reader's rate over an interval).
Histogram Difference(const Histogram& b, const Histogram& a);

}  // namespace warmpool::shm
