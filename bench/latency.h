// warmpool-bench (no mode flag): round-trip latency of `infer` on the echo model through warmpoold,
// compared in the same run with a raw two-hop Unix-socket relay that carries the identical frames
// (bench/relay.h), in interleaved rounds; p50, p99 and throughput against the targets. It is a
// report: it prints numbers and ratios and asserts nothing about them.
#pragma once

#include <cstdint>
#include <string>

namespace warmpool::bench {

struct LatencyOptions {
  std::string daemon;  // warmpoold binary; empty: next to warmpool-bench
  std::string backend = "host";
  uint64_t requests = 20000;
  uint64_t warmup = 2000;
  uint64_t payload = 1024;
  uint32_t clients = 1;
  uint32_t pipeline = 1;  // requests in flight per client
  uint32_t rounds = 4;
  bool json = false;
};

int RunLatency(const LatencyOptions& options);

}  // namespace warmpool::bench
