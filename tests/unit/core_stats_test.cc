// What the core counts in the segment's stats (shm/stats.h) as it decides: loads by source and
// their durations, releases by reason, crashes charged, worker restarts, queue wait, the gauges.
#include "tests/unit/core_rig.h"

namespace warmpool::supervisor::testing {
namespace {

uint64_t Releases(CoreRig& rig, const std::string& model, shm::ReleaseReason reason) {
  return rig.view().model_stats(rig.index().Find(model)).releases[static_cast<uint32_t>(reason)];
}
const shm::ModelStats& StatsOf(CoreRig& rig, const std::string& model) {
  return rig.view().model_stats(rig.index().Find(model));
}

TEST(CoreStatsTest, AnEvictionForRoomIsBudgetAndAnUnloadIsExplicit) {
  CoreRig rig(CoreRig::SmallConfig());  // budget 1000
  ModelEntry a = Entry("a", 550, 50), b = Entry("b", 550, 50);
  rig.Start({a, b});
  rig.Up(0);
  rig.Up(1);
  rig.Loaded(0, a, 100);
  rig.Advance(100);
  const shm::ModelStats& sa = StatsOf(rig, "a");
  EXPECT_EQ(sa.loads[static_cast<uint32_t>(shm::LoadSource::kFile)], 1u);
  EXPECT_EQ(sa.load_seconds.count, 1u);
  rig.Forget();
  rig.Load(1, "b");  // a is in the way
  EXPECT_EQ(Releases(rig, "a", shm::ReleaseReason::kBudget), 1u);
  EXPECT_EQ(Releases(rig, "a", shm::ReleaseReason::kExplicit), 0u);
  for (const v1::WorkerEnvelope& m : rig.Sent(0)) {
    if (m.has_unload()) rig.Reply(0, CoreRig::UnloadDone(m.unload().job()));
  }
  std::vector<v1::WorkerEnvelope> loads = rig.Sent(0), to1 = rig.Sent(1);
  loads.insert(loads.end(), to1.begin(), to1.end());
  ASSERT_EQ(loads.size(), 1u);
  ASSERT_TRUE(loads[0].has_load());
  rig.Reply(to1.empty() ? 0 : 1, CoreRig::LoadDone(loads[0].load().job(), b), {101});
  rig.Unload(1, "b");
  EXPECT_EQ(Releases(rig, "b", shm::ReleaseReason::kExplicit), 1u);
  EXPECT_EQ(Releases(rig, "b", shm::ReleaseReason::kBudget), 0u);
}

TEST(CoreStatsTest, ACountLimitIsCapacityAndSingleActiveIsItsOwnReason) {
  for (bool single : {false, true}) {
    Config config = CoreRig::SmallConfig();
    if (single) config.single_active = true;
    else config.capacity = 1;
    CoreRig rig(config);
    ModelEntry a = Entry("a", 100, 10), b = Entry("b", 100, 10);
    rig.Start({a, b});
    rig.Up(0);
    rig.Up(1);
    rig.Loaded(0, a, 100);
    rig.Load(1, "b");
    const auto expected = single ? shm::ReleaseReason::kSingleActive : shm::ReleaseReason::kCapacity;
    EXPECT_EQ(Releases(rig, "a", expected), 1u) << "single_active " << single;
    EXPECT_EQ(Releases(rig, "a", shm::ReleaseReason::kBudget), 0u);
  }
}

TEST(CoreStatsTest, KeepAliveExpiryAndQueueWait) {
  CoreRig rig(CoreRig::SmallConfig());
  ModelEntry a = Entry("a", 100, 10), b = Entry("b", 100, 10);
  rig.Start({a, b});
  rig.Up(0);
  rig.Up(1);
  // An inference that waits for the load: its queue wait is the load's time.
  rig.Infer(2, "a");
  std::vector<v1::WorkerEnvelope> sent = rig.Sent(0), to1 = rig.Sent(1);
  const uint32_t slot = sent.empty() ? 1 : 0;
  if (sent.empty()) sent = to1;
  ASSERT_EQ(sent.size(), 1u);
  rig.Advance(300);
  rig.Reply(slot, CoreRig::LoadDone(sent[0].load().job(), a), {100});
  const shm::ModelStats& s = StatsOf(rig, "a");
  ASSERT_EQ(s.queue_seconds.count, 1u);
  EXPECT_GE(s.queue_seconds.sum_ns, 300'000'000u);
  EXPECT_EQ(s.queue_seconds.buckets[shm::BucketOf(s.queue_seconds.sum_ns)], 1u);
  EXPECT_EQ(rig.view().pool_stats().inflight, 0u) << "gauges are published at ticks";
  rig.Advance(100);
  EXPECT_EQ(rig.view().pool_stats().inflight, 1u);
  for (const v1::WorkerEnvelope& m : rig.Sent(slot)) {
    if (m.has_infer()) rig.Reply(slot, CoreRig::InferDone(m.infer().job()));
  }
  // An inference asking for a keep_alive of 100 ms: released that long after it ends.
  v1::Envelope e;
  e.mutable_infer()->set_model("a");
  e.mutable_infer()->set_keep_alive_ms(100);
  e.mutable_infer()->mutable_input()->set_rows(1);
  e.mutable_infer()->mutable_input()->set_cols(4);
  e.mutable_infer()->mutable_input()->set_data(std::string(16, '\0'));
  rig.Request(2, e);
  for (const v1::WorkerEnvelope& m : rig.Sent(slot)) {
    if (m.has_infer()) rig.Reply(slot, CoreRig::InferDone(m.infer().job()));
  }
  EXPECT_EQ(Releases(rig, "a", shm::ReleaseReason::kKeepAlive), 0u);
  // The most recently used model never expires (policy::PlanExpiry): another one is used after.
  rig.Load(1, "b");
  for (uint32_t w : {0u, 1u}) {
    for (const v1::WorkerEnvelope& m : rig.Sent(w)) {
      if (m.has_load()) rig.Reply(w, CoreRig::LoadDone(m.load().job(), b), {101});
    }
  }
  ASSERT_EQ(rig.State("b"), shm::ModelState::kReady);
  rig.Advance(300);
  EXPECT_EQ(Releases(rig, "a", shm::ReleaseReason::kKeepAlive), 1u);
  EXPECT_EQ(rig.view().pool_stats().inflight, 0u);
}

TEST(CoreStatsTest, CrashesAreChargedAndRestartsCounted) {
  CoreRig rig(CoreRig::SmallConfig());
  ModelEntry a = Entry("a", 100, 10);
  rig.Start({a});
  rig.Up(0);
  rig.Up(1);
  rig.Loaded(0, a, 100);
  rig.Infer(2, "a");
  std::vector<v1::WorkerEnvelope> sent = rig.Sent(0);
  ASSERT_EQ(sent.size(), 1u);
  rig.Down(0, {sent[0].infer().job()});
  EXPECT_EQ(StatsOf(rig, "a").crashes_charged, 1u);
  EXPECT_EQ(rig.view().pool_stats().restarts[static_cast<uint32_t>(shm::RestartReason::kCrashed)], 1u);
  EXPECT_EQ(rig.view().pool_stats().restarts[static_cast<uint32_t>(shm::RestartReason::kKilled)], 0u);
}

}  // namespace
}  // namespace warmpool::supervisor::testing
