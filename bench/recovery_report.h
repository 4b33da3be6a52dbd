// warmpool-bench --recovery's figures: what one iteration measures, the baselines the run
// measures beside them, the targets, and the report (text, or one --json line) that sets
// them against each other.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bench/model_file.h"
#include "bench/recovery.h"
#include "bench/recovery_log.h"
#include "bench/stats.h"

namespace warmpool::bench {

// Issue targets: (a) every affected request answered within 2x the time the same requests take
// on the healthy pool; (b) the first new request within 10 ms plus its own compute.
inline constexpr double kTargetAllAnsweredRatio = 2.0;
inline constexpr double kTargetFirstSuccessSlackMs = 10.0;
inline constexpr const char* kModel = "mlp";
// The daemon's [recovery] settings for this mode, printed with the results.
inline constexpr uint32_t kRespawnMinMs = 1;
inline constexpr uint32_t kRespawnMaxMs = 100;
inline constexpr uint32_t kCrashLoopCrashes = 1000000;

// One iteration's measurements.
struct RecoverySample {
  uint64_t all_answered_ns = 0;    // (a): kill -> last of the K replies
  std::vector<uint64_t> affected_ns;  // kill -> each affected reply, in the order they came
  uint64_t first_success_ns = 0;   // (b): kill -> first successful new request
  bool first_success = false;
  uint32_t answered_before_kill = 0;  // replies read before the kill (not affected)
  uint32_t affected = 0;              // replies after the kill
  uint32_t failed = 0;                // of the K, replies that were errors (or never came)
  uint32_t probe_failures = 0;        // new requests that failed before the first success
  uint32_t inflight_at_kill = 0;      // status.inflight just before the kill
  std::string first_error;
  RecoveryLogEvents log;
};

// What the run measures on the healthy pool, before the kills.
struct RecoveryBaselines {
  Spread batch_infer;         // an infer of --rows rows
  Spread probe_infer;         // of 1 row
  Spread healthy_k;           // the --inflight requests pipelined, all answered
  Spread warm_load;           // unload, then load from the page cache
  Spread warm_load_reported;  // the daemon's own load_ms of those
};

// Prints the run's results: the iterations against the baselines and the targets.
void PrintRecoveryReport(const RecoveryOptions& options, const DenseModelFile& model,
                         const RecoveryBaselines& baselines, const std::vector<RecoverySample>& samples);

}  // namespace warmpool::bench
