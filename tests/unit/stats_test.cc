// The segment's stats (shm/stats.h) and their Prometheus text (metrics/prometheus.h).
#include <gtest/gtest.h>

#include <cstddef>
#include <vector>

#include "metrics/prometheus.h"
#include "shm/model_index.h"
#include "shm/segment.h"
#include "shm/stats.h"

namespace warmpool::shm {
namespace {

TEST(StatsTest, BucketsAndQuantiles) {
  EXPECT_EQ(BucketOf(0), 0u);
  EXPECT_EQ(BucketOf(500'000), 0u);      // 0.5 ms: le="0.0005"
  EXPECT_EQ(BucketOf(500'001), 1u);
  EXPECT_EQ(BucketOf(999'000'000'000), kHistogramBuckets - 1);
  Histogram h{};
  for (int i = 0; i < 90; i++) Observe(h, 2'000'000);   // 2 ms: (1, 2.5] ms
  for (int i = 0; i < 10; i++) Observe(h, 80'000'000);  // 80 ms: (50, 100] ms
  EXPECT_EQ(h.count, 100u);
  double p50 = Quantile(h, 0.5), p99 = Quantile(h, 0.99);
  EXPECT_GT(p50, 0.001);
  EXPECT_LE(p50, 0.0025);
  EXPECT_GT(p99, 0.05);
  EXPECT_LE(p99, 0.1);
  Histogram later = h;
  Observe(later, 2'000'000);
  Histogram d = Difference(later, h);
  EXPECT_EQ(d.count, 1u);
  EXPECT_EQ(Quantile(Histogram{}, 0.5), 0);
}

TEST(StatsTest, ARecordGivenToAnotherModelStartsAfresh) {
  Limits limits{4, 2, 8};
  std::vector<std::byte> bytes(SegmentSize(limits));
  SegmentView view = *SegmentView::Format(bytes, limits, {1 << 20}, 1);
  ModelIndex index(view);
  uint32_t a = *index.Register("a", "dense", "/a", 10);
  StatAdd(view.model_stats(a).requests[0][0], 5);
  const uint64_t generation = view.model_stats(a).generation;
  index.Unregister(a);
  uint32_t b = *index.Register("b", "dense", "/b", 10);
  ASSERT_EQ(a, b);  // the record is reused ...
  EXPECT_EQ(view.model_stats(b).requests[0][0], 0u);  // ... and its counters are not a's
  EXPECT_NE(view.model_stats(b).generation, generation);
}

TEST(MetricsTest, RendersTheSegment) {
  Limits limits{4, 2, 8};
  std::vector<std::byte> bytes(SegmentSize(limits));
  SegmentView view = *SegmentView::Format(bytes, limits, {1 << 20}, 1);
  ModelIndex index(view);
  uint32_t m = *index.Register("we\"ird", "dense", "/a", 10);
  StatAdd(view.model_stats(m).requests[0][0], 3);
  StatAdd(view.model_stats(m).requests[0][2], 1);
  Observe(view.model_stats(m).infer_seconds, 2'000'000);
  StatAdd(view.model_stats(m).releases[static_cast<uint32_t>(ReleaseReason::kKeepAlive)]);
  std::string text = metrics::RenderPrometheus(view, {"1.2.3", "host", "default"});
  auto has = [&](const std::string& line) { return text.find(line + "\n") != std::string::npos; };
  EXPECT_TRUE(has(R"(warmpool_build_info{version="1.2.3",backend="host",instance="default"} 1)")) << text;
  EXPECT_TRUE(has(R"(warmpool_model_requests_total{model="we\"ird",request="infer",code="OK"} 3)"));
  EXPECT_TRUE(has(R"(warmpool_model_requests_total{model="we\"ird",request="infer",code="INVALID_ARGUMENT"} 1)"));
  EXPECT_TRUE(has(R"(warmpool_model_inference_duration_seconds_bucket{model="we\"ird",le="0.001"} 0)"));
  EXPECT_TRUE(has(R"(warmpool_model_inference_duration_seconds_bucket{model="we\"ird",le="0.0025"} 1)"));
  EXPECT_TRUE(has(R"(warmpool_model_inference_duration_seconds_bucket{model="we\"ird",le="+Inf"} 1)"));
  EXPECT_TRUE(has(R"(warmpool_model_inference_duration_seconds_count{model="we\"ird"} 1)"));
  EXPECT_TRUE(has(R"(warmpool_model_releases_total{model="we\"ird",reason="keep_alive"} 1)"));
  EXPECT_TRUE(has(R"(warmpool_model_state{model="we\"ird",state="registered"} 1)"));
  EXPECT_TRUE(has(R"(warmpool_device_budget_bytes{device="0"} 1048576)"));
  EXPECT_TRUE(has("# TYPE warmpool_model_inference_duration_seconds histogram"));
  EXPECT_TRUE(has("# TYPE warmpool_worker_restarts_total counter"));
  EXPECT_EQ(metrics::EscapeLabel("a\\b\n\"c\""), "a\\\\b\\n\\\"c\\\"");
}

}  // namespace
}  // namespace warmpool::shm
