#include "bench/stats.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

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

double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

Spread SpreadOf(std::vector<uint64_t> ns) {
  Spread s;
  s.count = ns.size();
  if (ns.empty()) return s;
  std::sort(ns.begin(), ns.end());
  s.median_ms = Percentile(ns, 50) / 1e6;
  s.p90_ms = Percentile(ns, 90) / 1e6;
  s.min_ms = ns.front() / 1e6;
  s.max_ms = ns.back() / 1e6;
  return s;
}

Spread SpreadOf(std::vector<double> ms) {
  Spread s;
  s.count = ms.size();
  if (ms.empty()) return s;
  std::sort(ms.begin(), ms.end());
  s.median_ms = ms[ms.size() / 2];
  const double rank = std::ceil(0.9 * static_cast<double>(ms.size()));
  s.p90_ms = ms[std::min(ms.size() - 1, rank < 1 ? size_t{0} : static_cast<size_t>(rank) - 1)];
  s.min_ms = ms.front();
  s.max_ms = ms.back();
  return s;
}

std::string SpreadJson(const Spread& s) {
  return fmt::format(
      "{{\"count\": {}, \"median_ms\": {:.4f}, \"p90_ms\": {:.4f}, \"min_ms\": {:.4f}, \"max_ms\": {:.4f}}}",
      s.count, s.median_ms, s.p90_ms, s.min_ms, s.max_ms);
}

}  // namespace warmpool::bench
