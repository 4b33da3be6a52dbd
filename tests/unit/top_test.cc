// `warmpool top` without a daemon or a terminal: the segment reader over a byte vector, the rates
// and events the tracker derives from two samples, and the text layout at different screen sizes.
#include <gtest/gtest.h>

#include <cstddef>
#include <string>
#include <vector>

#include "top/top_sample.h"
#include "top/top_text.h"
#include "top/top_tracker.h"
#include "top/top_view.h"
#include "shm/model_index.h"
#include "shm/segment.h"

namespace warmpool::top {
namespace {

constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kSecond = 1000000000ull;

bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

std::string Joined(const std::vector<std::string>& lines) {
  std::string out;
  for (const std::string& line : lines) out += line + "\n";
  return out;
}

// A segment in a byte vector with one ready model, one registered one and one worker, written the
// way the supervisor writes it.
class SegmentFixture : public ::testing::Test {
 protected:
  SegmentFixture() : bytes_(shm::SegmentSize(kLimits)) {
    Result<shm::SegmentView> view = shm::SegmentView::Format(bytes_, kLimits, {64 * kMiB}, 1);
    EXPECT_TRUE(view.ok()) << view.status().ToString();
    view_ = *view;
    index_ = std::make_unique<shm::ModelIndex>(view_);
    ready_ = *index_->Register("classifier", "dense", "/m/classifier.safetensors", 8 * kMiB);
    idle_ = *index_->Register("encoder", "dense", "/m/encoder.safetensors", 4 * kMiB);
    shm::ModelIndex::Residency loaded;
    loaded.state = shm::ModelState::kReady;
    loaded.worker_slot = 0;
    loaded.replicas = 1;
    loaded.weight_bytes = 8 * kMiB;
    index_->Publish(ready_, loaded);
    shm::SeqWrite(view_.worker(0), [](shm::WorkerRecord& w) {
      w.state = static_cast<uint32_t>(shm::WorkerState::kIdle);
      w.pid = 4242;
      w.generation = 1;
      w.last_exit = -1;
      w.models = 1;
      w.served = 7;
      for (uint32_t& held : w.held) held = shm::kNil;
      w.held[0] = 0;
    });
  }

  // n inference requests answered with code, each taking `ns`.
  void Answer(uint32_t model, uint32_t n, uint32_t code, uint64_t ns) {
    shm::ModelStats& stats = view_.model_stats(model);
    for (uint32_t i = 0; i < n; i++) {
      shm::StatAdd(stats.requests[static_cast<uint32_t>(shm::RequestKind::kInfer)][code]);
      shm::Observe(stats.infer_seconds, ns);
    }
  }
  PoolSample SampleAt(uint64_t second) {
    PoolSample sample = SampleSegment(view_);
    sample.taken = std::chrono::steady_clock::time_point(std::chrono::seconds(second));
    sample.taken_unix_ns = second * kSecond;
    return sample;
  }

  static constexpr shm::Limits kLimits{8, 4, 16};
  std::vector<std::byte> bytes_;
  shm::SegmentView view_;
  std::unique_ptr<shm::ModelIndex> index_;
  uint32_t ready_ = 0, idle_ = 0;
};

TEST_F(SegmentFixture, SampleCopiesRecordsAccountsAndStats) {
  Answer(ready_, 3, 0, 2000000);
  PoolSample sample = SampleSegment(view_);
  ASSERT_TRUE(sample.from_segment());
  ASSERT_EQ(sample.devices.size(), 1u);
  EXPECT_EQ(sample.devices[0].used_bytes, 8 * kMiB);
  EXPECT_EQ(sample.devices[0].budget_bytes, 64 * kMiB);
  ASSERT_EQ(sample.models.size(), 2u);
  EXPECT_EQ(sample.models[0].name, "classifier");
  EXPECT_EQ(sample.models[0].state, shm::ModelState::kReady);
  ASSERT_TRUE(sample.models[0].stats.has_value());
  EXPECT_EQ(sample.models[0].stats->requests[0][0], 3u);
  ASSERT_EQ(sample.workers.size(), 1u);
  EXPECT_EQ(sample.workers[0].pid, 4242);
  EXPECT_EQ(sample.workers[0].state, "idle");
  EXPECT_EQ(sample.workers[0].served, 7u);
  EXPECT_EQ(sample.workers[0].models, std::vector<std::string>{"classifier"});
  EXPECT_EQ(sample.workers[0].last_exit, "");
}

TEST_F(SegmentFixture, RatesAndLatencyOverTheInterval) {
  Tracker tracker;
  Answer(ready_, 100, 0, 1000000);  // before the first sample: not in any rate
  Frame first = tracker.Next(SampleAt(10));
  ASSERT_FALSE(first.models.empty());
  EXPECT_FALSE(first.models[0].rates.requests_per_second.has_value());
  Answer(ready_, 18, 0, 2000000);  // 2 ms: the (1 ms, 2.5 ms] bucket
  Answer(ready_, 2, 8, 40000000);  // INTERNAL after 40 ms
  Frame second = tracker.Next(SampleAt(12));
  const ModelRow& row = second.models[0];
  ASSERT_EQ(row.model.name, "classifier");
  EXPECT_DOUBLE_EQ(*row.rates.requests_per_second, 10.0);
  EXPECT_DOUBLE_EQ(*row.rates.error_ratio, 0.1);
  EXPECT_GT(*row.rates.p50_seconds, 0.001);
  EXPECT_LE(*row.rates.p50_seconds, 0.0025);
  EXPECT_GT(*row.rates.p99_seconds, 0.025);
  EXPECT_LE(*row.rates.p99_seconds, 0.05);
  EXPECT_EQ(second.idle_registered, 1u);  // encoder: registered, no traffic
}

TEST_F(SegmentFixture, ARecordGivenToAnotherModelStartsItsRatesOver) {
  Tracker tracker;
  tracker.Next(SampleAt(1));
  Answer(idle_, 50, 0, 1000000);
  // encoder is forgotten and its record goes to a new model: stats reset, generation bumped.
  index_->Unregister(idle_);
  ASSERT_EQ(*index_->Register("ranker", "dense", "/m/ranker.safetensors", kMiB), idle_);
  shm::ModelIndex::Residency loaded;
  loaded.state = shm::ModelState::kReady;
  loaded.worker_slot = 0;
  loaded.replicas = 1;
  loaded.weight_bytes = kMiB;
  index_->Publish(idle_, loaded);
  Answer(idle_, 5, 0, 1000000);
  Frame frame = tracker.Next(SampleAt(2));
  bool shown = false;
  for (const ModelRow& row : frame.models) {
    EXPECT_NE(row.model.name, "encoder");
    if (row.model.name != "ranker") continue;
    shown = true;
    // Compared with encoder's 50 the counters went backwards; compared with nothing, no rate.
    EXPECT_FALSE(row.rates.requests_per_second.has_value());
  }
  EXPECT_TRUE(shown);
  // The next interval is ranker's own.
  Answer(idle_, 3, 0, 1000000);
  for (const ModelRow& row : tracker.Next(SampleAt(3)).models) {
    if (row.model.name == "ranker") {
      EXPECT_DOUBLE_EQ(row.rates.requests_per_second.value_or(-1), 3.0);
    }
  }
}

TEST_F(SegmentFixture, EventsFromCounterAndWorkerChangesNewestFirst) {
  Tracker tracker(3);
  tracker.Next(SampleAt(1));
  shm::ModelStats& stats = view_.model_stats(ready_);
  shm::StatAdd(stats.releases[static_cast<uint32_t>(shm::ReleaseReason::kBudget)], 2);
  shm::StatAdd(stats.loads[static_cast<uint32_t>(shm::LoadSource::kUnpark)]);
  shm::StatAdd(stats.crashes_charged);
  shm::SeqWrite(view_.worker(0), [](shm::WorkerRecord& w) {
    w.restarts = 1;
    w.last_exit = 128 + 9;
    w.pid = 4343;
  });
  Frame frame = tracker.Next(SampleAt(2));
  std::string text;
  for (const Event& e : frame.events) text += e.text + "\n";
  ASSERT_EQ(frame.events.size(), 3u) << text;  // four noticed, three kept: the oldest went
  EXPECT_TRUE(Contains(frame.events[0].text, "worker 0 (pid 4242) killed by signal 9")) << text;
  EXPECT_TRUE(Contains(text, "classifier charged with a worker crash")) << text;
  EXPECT_TRUE(Contains(text, "evicted classifier (device budget) x2")) << text;
  EXPECT_FALSE(Contains(text, "unparked")) << text;
  EXPECT_EQ(frame.events[0].unix_ns, 2 * kSecond);
  // Nothing changed since: no new events, the old ones stay.
  EXPECT_EQ(tracker.Next(SampleAt(3)).events.size(), 3u);
}

TEST(TopSocketSample, StatesStandInForCountersWithoutTheSegment) {
  v1::StatusReply status;
  status.add_devices()->set_budget_bytes(10 * kMiB);
  v1::WorkerStatus* worker = status.add_workers();
  worker->set_state("idle");
  worker->set_pid(7);
  v1::PsReply ps;
  Tracker tracker;
  tracker.Next(SampleReplies(status, ps));
  v1::PsEntry* entry = ps.add_models();
  entry->set_name("echo");
  entry->set_state("ready");
  Frame frame = tracker.Next(SampleReplies(status, ps));
  EXPECT_FALSE(frame.pool.from_segment());
  ASSERT_EQ(frame.models.size(), 1u);
  EXPECT_FALSE(frame.models[0].rates.requests_per_second.has_value());
  ASSERT_EQ(frame.events.size(), 1u);
  EXPECT_EQ(frame.events[0].text, "echo ready");
  ps.clear_models();
  frame = tracker.Next(SampleReplies(status, ps));
  EXPECT_EQ(frame.events[0].text, "echo unloaded");
}

TEST(TopOrder, ReadyFirstThenBusiestThenName) {
  auto row = [](std::string name, shm::ModelState state, double rps) {
    ModelRow r;
    r.model.name = std::move(name);
    r.model.state = state;
    r.rates.requests_per_second = rps;
    return r;
  };
  std::vector<ModelRow> rows = {
      row("b", shm::ModelState::kParked, 50), row("c", shm::ModelState::kReady, 1),
      row("a", shm::ModelState::kReady, 1), row("d", shm::ModelState::kReady, 9)};
  std::sort(rows.begin(), rows.end(), ShownBefore);
  std::string order;
  for (const ModelRow& r : rows) order += r.model.name;
  EXPECT_EQ(order, "dacb");
}

TEST(TopText, NarrowTablesDropTheHighestDropOrderFirst) {
  const std::vector<Column> columns = {{"NAME"}, {"WIDE", false, 2}, {"RATE", true, 1}};
  const std::vector<std::vector<std::string>> rows = {{"classifier", "xxxxxxxxxxxxxxxx", "12.5"}};
  std::vector<std::string> wide = LayoutTable(columns, rows, 0);
  EXPECT_EQ(wide[0], "NAME        WIDE              RATE");
  EXPECT_EQ(wide[1], "classifier  xxxxxxxxxxxxxxxx  12.5");
  std::vector<std::string> narrow = LayoutTable(columns, rows, 20);
  EXPECT_EQ(narrow[1], "classifier  12.5");
  std::vector<std::string> tiny = LayoutTable(columns, rows, 6);  // only NAME left, then cut
  EXPECT_EQ(tiny[1], "classi");
}

TEST(TopText, TruncateKeepsUtf8SequencesWhole) {
  EXPECT_EQ(Truncate("modèle-été", 5), "modèl");
  EXPECT_EQ(DisplayWidth("modèle"), 6u);
  EXPECT_EQ(Bar(0.5, 10), "[#####.....]");
  EXPECT_EQ(Bar(0.0001, 10), "[#.........]");  // in use is never shown as empty
  EXPECT_EQ(FormatDuration(3725), "1h 02m");
  EXPECT_EQ(FormatLatency(0.0004), "0.4ms");
  EXPECT_EQ(FormatLatency(std::nullopt), "-");
}

TEST_F(SegmentFixture, ScreenFitsTheWindowAndShowsTheEssentials) {
  Tracker tracker;
  tracker.Next(SampleAt(1));
  Answer(ready_, 4, 0, 1000000);
  Frame frame = tracker.Next(SampleAt(3));
  ViewContext context{"0.1.0", "host", "test", "", "", 1, 3 * kSecond};
  const std::string wide = Joined(RenderFrame(frame, context, 160, 50));
  EXPECT_TRUE(Contains(wide, "classifier")) << wide;
  EXPECT_TRUE(Contains(wide, "ready")) << wide;
  EXPECT_TRUE(Contains(wide, "8.0 MiB of 64.0 MiB")) << wide;
  EXPECT_TRUE(Contains(wide, "REQ/S")) << wide;
  EXPECT_TRUE(Contains(wide, "2.0")) << wide;  // 4 requests in 2 s
  EXPECT_TRUE(Contains(wide, "4242")) << wide;
  EXPECT_TRUE(Contains(wide, "(and 1 registered model not loaded)")) << wide;
  for (size_t width : {40u, 80u}) {
    for (size_t height : {8u, 24u}) {
      std::vector<std::string> lines = RenderFrame(frame, context, width, height);
      EXPECT_LE(lines.size(), height);
      for (const std::string& line : lines) EXPECT_LE(DisplayWidth(line), width) << line;
    }
  }
}

}  // namespace
}  // namespace warmpool::top
