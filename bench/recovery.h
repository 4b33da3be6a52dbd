// warmpool-bench --recovery: what a worker crash costs. A private warmpoold serves one dense model
// on two workers; each iteration makes the model's worker busy with K pipelined requests, SIGKILLs
// it, and measures from the kill (a) until every one of those K requests is answered (the
// supervisor retries them after reloading the model on another worker) and (b) until a new request
// sent right after the kill from a second connection first succeeds. The baselines, measured in
// the same run: for (a) the same K requests pipelined on the healthy pool, for (b) the new
// request's own compute; a warm load from the page cache is shown for scale. It reports numbers
// against the targets and asserts nothing.
#pragma once

#include <cstdint>
#include <string>

namespace warmpool::bench {

struct RecoveryOptions {
  std::string daemon;            // warmpoold binary; empty: next to warmpool-bench
  std::string backend = "host";  // warmpoold --backend
  uint32_t iterations = 20;      // kills, and unload+load pairs of the baseline
  uint64_t model_mib = 16;       // f32 weights of the generated model
  uint32_t inflight = 8;         // K: requests pipelined on the worker when it is killed
  uint32_t rows = 64;            // rows of each of those requests
  uint32_t replicas = 1;         // of the model, on the two workers
  bool json = false;
};

// Runs the whole mode; returns the process exit status (0, or 1 after printing an error).
int RunRecovery(const RecoveryOptions& options);

}  // namespace warmpool::bench
