// warmpool-bench --batching: what dynamic batching buys. A private warmpoold serves one dense model
// (--layers, default 1024,4096,1024, f32) under two names: "batched" with [pool]
// max_batch_delay_us = --delay-us, and "unbatched" with batching off. --clients closed-loop
// clients each send one row at a time; per round, interleaved, the same number of requests goes to
// each name. The baseline, in the same run, is the dense engine in-process computing --clients rows
// in one call (what a perfect batcher would do, with no request path at all). Reports requests/s,
// p50/p99 latency and the ratios batched/unbatched (target >= 4x) and batched/in-process (target
// >= 0.8x). Like the other modes it asserts nothing.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace warmpool::bench {

struct BatchingOptions {
  std::string daemon;            // warmpoold binary; empty: next to warmpool-bench
  std::string backend = "host";  // warmpoold --backend
  std::vector<uint32_t> layers = {1024, 4096, 1024};  // in, hidden, out (in = out: the bench checks shapes)
  uint32_t clients = 16;
  uint64_t requests = 4000;      // per name per round, over all clients
  uint32_t rounds = 3;
  uint32_t delay_us = 500;
  bool json = false;
};

// Runs the whole mode; returns the process exit status (0, or 1 after printing an error).
int RunBatching(const BatchingOptions& options);

}  // namespace warmpool::bench
