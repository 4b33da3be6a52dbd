#include "bench/stats.h"

#include <algorithm>
#include <cmath>

namespace warmpool::bench {

uint64_t Percentile(const std::vector<uint64_t>& sorted, double p) {
  if (sorted.empty()) return 0;
  double rank = std::ceil(p / 100.0 * static_cast<double>(sorted.size()));
  size_t index = rank < 1 ? 0 : static_cast<size_t>(rank) - 1;
  return sorted[std::min(index, sorted.size() - 1)];
}

Summary Summarize(std::vector<uint64_t>& latencies_ns, double wall_s) {
  Summary s;
  s.count = latencies_ns.size();
  s.wall_s = wall_s;
  if (latencies_ns.empty()) return s;
  std::sort(latencies_ns.begin(), latencies_ns.end());
  long double total = 0;
  for (uint64_t v : latencies_ns) total += v;
  s.p50_us = Percentile(latencies_ns, 50) / 1e3;
  s.p99_us = Percentile(latencies_ns, 99) / 1e3;
  s.mean_us = static_cast<double>(total / latencies_ns.size()) / 1e3;
  s.min_us = latencies_ns.front() / 1e3;
  s.max_us = latencies_ns.back() / 1e3;
  s.requests_per_s = wall_s > 0 ? static_cast<double>(s.count) / wall_s : 0;
  return s;
}

}  // namespace warmpool::bench
