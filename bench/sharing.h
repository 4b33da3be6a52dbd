// warmpool-bench --sharing: what the supervisor-held weights (one memfd per resident model) buy.
// A private warmpoold with four workers serves one dense model per size; for each size, in the same
// run, it measures
//   1. a cold load from the page cache (unload, then load with replicas = 1) against `cat FILE >
//      /dev/null` of the same file (fork + exec of /bin/cat), as a throughput ratio;
//   2. replica attach: LoadRequest with replicas = 2, 3, 4 on a model with one replica, timed from
//      the request until `ps` shows the new replica count (ps polled in a tight loop);
//   3. the proportional set size (smaps_rollup Pss) of the four workers once all four replicas have
//      served inferences (so every worker has touched the weights), against one copy of the file;
//   4. unpark: with [pool] park_budget set (twice the largest model), a load (replicas = 1) of the
//      model after `unload --park`, timed request to reply and confirmed by the daemon's
//      'unparking "NAME"' log line, against memcpy of the weight bytes into a freshly mapped buffer
//      (the copy faults its pages in), into a fresh memfd region, and into a reused, faulted
//      buffer (the target's baseline), as throughput ratios;
//   5. the first request after a switch (unload, load: one 1-row request) and after a second
//      replica's attach (two at once, one per replica), against the requests that follow.
// Measuring lives in sharing.cc and sharing_measure.cc (the run's class in sharing_run.h), the report
// in sharing_report.cc.
// Like the other modes it reports numbers against the targets of issue 4 and asserts nothing.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace warmpool::bench {

struct SharingOptions {
  std::string daemon;                       // warmpoold binary; empty: next to warmpool-bench
  std::string backend = "host";             // warmpoold --backend
  std::vector<uint64_t> sizes_mib = {16, 1024};  // f32 weights of each generated model
  uint32_t iterations = 10;                 // per size: cat + load pairs, attaches, unparks
  uint32_t poll_us = 50;                    // sleep between two ps polls while waiting for a replica
  // Input and output width of the generated MLP (in -> hidden -> out, hidden sized to the file);
  // 0: square, in = out ~ hidden. The dense engine's per-replica workspace is two buffers of
  // 256 rows of the hidden width, so a narrow in/out (wide hidden) makes every replica bring a
  // large workspace of its own: with 1024, a 1 GiB model has a 131008-wide hidden layer and
  // 256 MiB of workspace per replica, which then dominates attach time and PSS.
  uint32_t features = 0;
  bool json = false;
};

// Runs the whole mode; returns the process exit status (0, or 1 after printing an error).
int RunSharing(const SharingOptions& options);

}  // namespace warmpool::bench
