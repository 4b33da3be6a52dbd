// Latency summaries for the benchmark: nearest-rank percentiles over every recorded sample.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
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

inline double Ms(std::chrono::steady_clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }
inline double MsSince(std::chrono::steady_clock::time_point start) { return Ms(std::chrono::steady_clock::now() - start); }

// The middle value (the upper one of an even count); 0 when there are none.
double Median(std::vector<double> values);

// How the timings of one measurement spread, in milliseconds (all zero when there are none).
struct Spread {
  uint64_t count = 0;
  double median_ms = 0;
  double p90_ms = 0;
  double min_ms = 0;
  double max_ms = 0;
};
// Of samples in nanoseconds: nearest-rank median and p90.
Spread SpreadOf(std::vector<uint64_t> ns);
// Of samples in milliseconds: the median as Median's, p90 nearest rank.
Spread SpreadOf(std::vector<double> ms);
// {"count": .., "median_ms": .., "p90_ms": .., "min_ms": .., "max_ms": ..}
std::string SpreadJson(const Spread& s);

}  // namespace warmpool::bench
