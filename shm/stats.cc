#include "shm/stats.h"

namespace warmpool::shm {

uint32_t BucketOf(uint64_t ns) {
  const double seconds = static_cast<double>(ns) / 1e9;
  for (uint32_t b = 0; b + 1 < kHistogramBuckets; b++) {
    if (seconds <= kBucketBoundsSeconds[b]) return b;
  }
  return kHistogramBuckets - 1;
}

void Observe(Histogram& histogram, uint64_t ns) {
  // Buckets before the count: a reader that sees the count sees at least as many in buckets.
  StatAdd(histogram.buckets[BucketOf(ns)]);
  StatAdd(histogram.sum_ns, ns);
  StatAdd(histogram.count);
}

Histogram LoadHistogram(const Histogram& histogram) {
  Histogram copy{};
  copy.count = StatLoad(histogram.count);
  for (uint32_t b = 0; b < kHistogramBuckets; b++) copy.buckets[b] = StatLoad(histogram.buckets[b]);
  copy.sum_ns = StatLoad(histogram.sum_ns);
  return copy;
}

Histogram Difference(const Histogram& b, const Histogram& a) {
  Histogram d{};
  auto minus = [](uint64_t x, uint64_t y) { return x >= y ? x - y : 0; };
  for (uint32_t i = 0; i < kHistogramBuckets; i++) d.buckets[i] = minus(b.buckets[i], a.buckets[i]);
  d.count = minus(b.count, a.count);
  d.sum_ns = minus(b.sum_ns, a.sum_ns);
  return d;
}

double Quantile(const Histogram& delta, double q) {
  uint64_t total = 0;
  for (uint64_t n : delta.buckets) total += n;
  if (total == 0) return 0;
  const double rank = q * static_cast<double>(total);
  double seen = 0;
  for (uint32_t b = 0; b < kHistogramBuckets; b++) {
    const double n = static_cast<double>(delta.buckets[b]);
    if (seen + n >= rank && n > 0) {
      const double lower = b == 0 ? 0 : kBucketBoundsSeconds[b - 1];
      // The +Inf bucket has no upper bound: its lower bound is the best estimate (as Prometheus).
      if (b + 1 == kHistogramBuckets) return lower;
      const double upper = kBucketBoundsSeconds[b];
      return lower + (upper - lower) * ((rank - seen) / n);
    }
    seen += n;
  }
  return kBucketBoundsSeconds[kHistogramBuckets - 2];
}

}  // namespace warmpool::shm
