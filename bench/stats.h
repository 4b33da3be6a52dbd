// Latency summaries for the benchmark: nearest-rank percentiles over every recorded sample.
#pragma once

#include <cstdint>
#include <vector>

namespace warmpool::bench {

struct Summary {
  uint64_t count = 0;
  double p50_us = 0;
  double p99_us = 0;
  double mean_us = 0;
  double min_us = 0;
  double max_us = 0;
  double requests_per_s = 0;  // count / wall_s
  double wall_s = 0;
};

// Nearest-rank percentile (p in [0, 100]) of sorted samples; 0 when there are none.
uint64_t Percentile(const std::vector<uint64_t>& sorted, double p);

// Summarizes latencies in nanoseconds (sorted in place) measured over wall_s seconds of wall time.
Summary Summarize(std::vector<uint64_t>& latencies_ns, double wall_s);

}  // namespace warmpool::bench
