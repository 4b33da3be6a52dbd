// What warmpool-bench --sharing measures for each model size (bench/sharing.h), the targets it
// reports them against, and the report itself (sharing_report.cc), apart from the measuring.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "bench/model_file.h"
#include "bench/sharing.h"
#include "bench/sharing_probes.h"

namespace warmpool::bench {

inline constexpr uint32_t kSharingWorkers = 4;
inline constexpr uint32_t kPipelined = 8;  // inferences sent at once per round of the PSS phase
inline constexpr double kTargetLoadRatio = 0.7;
inline constexpr double kTargetAttachMs = 1.0;
inline constexpr double kTargetPssRatio = 1.1;
inline constexpr double kTargetUnparkRatio = 0.7;
inline constexpr double kTargetFirstRatio = 1.5;
inline constexpr uint32_t kSteadyCalls = 3;  // steady requests timed after each first one

struct WorkerMemory {
  uint32_t slot = 0;
  pid_t pid = 0;
  probes::MemoryUse before;  // right after the last attach, before any inference
  probes::MemoryUse after;   // once every replica has served (touched the weights)
};

struct SizeResult {
  uint64_t size_mib = 0;
  std::string model;
  DenseModelFile file;
  uint64_t workspace_bytes = 0;  // per replica: ps bytes - weight_bytes with one replica
  uint64_t file_bytes = 0;
  uint32_t iterations = 0;
  // 1. cold load vs cat
  Spread cat, cat_empty, load, load_reported;
  double cat_gbps = 0, load_gbps = 0, load_ratio = 0;
  // cat less the median fork+exec+wait of an empty cat (the reading alone)
  double cat_read_ms = 0, cat_read_gbps = 0, load_ratio_read = 0;
  // 2. attach: index 0 = 1 -> 2, 1 = 2 -> 3, 2 = 3 -> 4
  Spread attach[kSharingWorkers - 1], attach_reply[kSharingWorkers - 1];
  Spread attach_all;
  uint64_t polls = 0;
  Spread poll_rtt;  // one ps round trip, measured while polling
  // 3. PSS
  std::vector<WorkerMemory> workers;
  probes::MemoryUse supervisor;
  uint32_t touch_rounds = 0;
  bool all_touched = false;
  uint64_t pss_sum = 0, rss_sum = 0, pss_before_sum = 0, rss_before_sum = 0;
  uint64_t pss_shmem_sum = 0;  // Pss of shared memory: the weights' memfd (and the daemon's segment)
  uint64_t pss_idle_sum = 0;   // the same workers idle, before any model was loaded
  double pss_ratio = 0, rss_ratio = 0, pss_shmem_ratio = 0, pss_above_idle_ratio = 0;
  // 4. unpark (load of a parked model, replicas 1) vs memcpy of weight_bytes, in the same loop
  Spread unpark, unpark_reported, park;  // park: the `unload --park` call, for information
  Spread memcpy_fresh, memcpy_memfd, memcpy_reused;
  uint64_t unpark_log_lines = 0;  // 'unparking "NAME"' lines the daemon logged during the phase
  double unpark_gbps = 0, memcpy_fresh_gbps = 0, memcpy_memfd_gbps = 0, memcpy_reused_gbps = 0;
  double unpark_ratio_fresh = 0, unpark_ratio_memfd = 0, unpark_ratio_reused = 0;
  // 5. the first request after a load (one 1-row request) and after a replica's attach (two at
  // once, one for each replica), against the same requests once the replicas have served
  Spread first_after_load, steady_after_load, first_after_attach, steady_after_attach;
  double first_load_ratio = 0, first_attach_ratio = 0;
};

// Prints the results (a table, or one JSON object with --json).
void ReportSharing(const SharingOptions& options, const std::vector<SizeResult>& results, uint64_t budget,
                   uint64_t park_budget);

}  // namespace warmpool::bench
