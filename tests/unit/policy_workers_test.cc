// The policies about workers, as tables: retries and crash loops, cooldowns and respawn backoff,
// where loads and requests go among workers and replicas, and the device owner's respawns and
// grants. No core, no segment, no process (the pool's admission and placement: policy_test.cc).
#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "supervisor/policy/device_owner.h"
#include "supervisor/policy/placement.h"
#include "supervisor/policy/retry.h"

namespace warmpool::supervisor::policy {
namespace {

TEST(RetryTest, ARequestIsRetriedAfterOneCrashNotTwo) {
  EXPECT_TRUE(RetryAfterCrash(0, 0));
  EXPECT_TRUE(RetryAfterCrash(1, 0));
  EXPECT_FALSE(RetryAfterCrash(2, 0)) << "two crashes while it ran alone: it is the cause";
  EXPECT_TRUE(RetryAfterCrash(0, 3)) << "three crashes beside others: it may be innocent";
  EXPECT_FALSE(RetryAfterCrash(0, 4)) << "but not forever";
  EXPECT_FALSE(RetryAfterCrash(1, 1)) << "a suspect that then crashes alone is the cause: two in all";
}

TEST(RetryTest, CrashesWithinTheWindowMakeACrashLoop) {
  RetrySettings s;
  s.crash_loop_crashes = 3;
  s.crash_loop_window_ms = 1000;
  CrashRecord r;
  EXPECT_FALSE(ChargeCrash(r, 0, s));
  EXPECT_FALSE(ChargeCrash(r, 500, s));
  EXPECT_FALSE(ChargeCrash(r, 1600, s)) << "the first two crashes fell out of the window";
  EXPECT_FALSE(ChargeCrash(r, 1700, s));
  EXPECT_TRUE(ChargeCrash(r, 1800, s));
  EXPECT_TRUE(r.times_ms.empty()) << "a crash loop starts the count over";
}

// A crash shared with another model's job (a load beside an inference) may be the neighbour's:
// it counts towards the loop only at twice the threshold; crashes alone at the threshold.
TEST(RetryTest, CrashesBesideAnotherModelMakeALoopOnlyAtTwiceTheThreshold) {
  RetrySettings s;
  s.crash_loop_crashes = 3;
  s.crash_loop_window_ms = 1000;
  CrashRecord r;
  for (uint64_t t = 0; t < 5; ++t) EXPECT_FALSE(ChargeCrash(r, t, s, /*alone=*/false)) << "shared crash " << t + 1;
  EXPECT_TRUE(ChargeCrash(r, 5, s, /*alone=*/false)) << "the sixth: a model that only crashes beside others ends too";
  EXPECT_TRUE(r.times_ms.empty() && r.alone_times_ms.empty());
  EXPECT_FALSE(ChargeCrash(r, 10, s, /*alone=*/false));
  EXPECT_FALSE(ChargeCrash(r, 11, s, /*alone=*/true));
  EXPECT_FALSE(ChargeCrash(r, 12, s, /*alone=*/true)) << "two alone, three in all";
  EXPECT_TRUE(ChargeCrash(r, 13, s, /*alone=*/true)) << "three alone";
}

TEST(RetryTest, CooldownsDoubleUpToTheMaximumAndAreForgivenAfterAWindow) {
  RetrySettings s;
  s.cooldown_ms = 100;
  s.cooldown_max_ms = 350;
  s.crash_loop_window_ms = 1000;
  CrashRecord r;
  EXPECT_EQ(NextCooldown(r, s), 100u);
  EXPECT_EQ(NextCooldown(r, s), 200u);
  EXPECT_EQ(NextCooldown(r, s), 350u);
  EXPECT_EQ(NextCooldown(r, s), 350u);
  r.times_ms = {5000};
  Forgive(r, 5500, s);
  EXPECT_EQ(r.cooldown_ms, 350u) << "not a whole window yet";
  Forgive(r, 6001, s);
  EXPECT_EQ(NextCooldown(r, s), 100u);
}

TEST(RetryTest, RespawnBackoffDoublesAndStartsOverAfterAStableRun) {
  RetrySettings s;
  s.respawn_min_ms = 10;
  s.respawn_max_ms = 35;
  s.respawn_stable_ms = 1000;
  EXPECT_EQ(RespawnDelay(0, 5, s), 10u);
  EXPECT_EQ(RespawnDelay(10, 5, s), 20u);
  EXPECT_EQ(RespawnDelay(20, 5, s), 35u);
  EXPECT_EQ(RespawnDelay(35, 5, s), 35u);
  EXPECT_EQ(RespawnDelay(35, 1000, s), 10u);
}

TEST(PlacementTest, LoadsGoToTheWorkerWithFewestModelsThenLeastWork) {
  EXPECT_EQ(PickWorkerForLoad({{0, true, 2, 0}, {1, true, 1, 5}, {2, true, 1, 3}}), 2u);
  EXPECT_EQ(PickWorkerForLoad({{0, true, 0, 9}, {1, true, 1, 0}}), 0u);
  EXPECT_EQ(PickWorkerForLoad({{3, true, 1, 0}, {1, true, 1, 0}}), 3u) << "ties: the first listed";
  EXPECT_EQ(PickWorkerForLoad({{0, false, 0, 0}, {1, true, 4, 4}, {2, false, 0, 0}}), 1u);
  EXPECT_EQ(PickWorkerForLoad({{0, true, 0, 0}, {1, true, 1, 0}}, {0}), 1u) << "busy ones left out";
  EXPECT_EQ(PickWorkerForLoad({}), kNone);
  EXPECT_EQ(PickWorkerForLoad({{0, false, 0, 0}}), kNone);
}

TEST(PlacementTest, AnIdleWorkerHasNothingOutstandingAndFewestModels) {
  EXPECT_EQ(PickIdleWorker({{0, true, 0, 1}, {1, true, 2, 0}, {2, true, 1, 0}}), 2u);
  EXPECT_EQ(PickIdleWorker({{0, true, 0, 1}, {1, false, 0, 0}}), kNone) << "busy or down";
  EXPECT_EQ(PickIdleWorker({{0, true, 0, 0}, {1, true, 1, 0}}, {0}), 1u) << "busy ones left out";
  EXPECT_EQ(PickIdleWorker({}), kNone);
}

TEST(PlacementTest, RequestsGoToTheReplicaWithRoomAndLeastWork) {
  Window window{4, 1000};
  std::vector<WorkerView> w = {{0, true, 1, 3, 10}, {1, true, 1, 1, 10}, {2, true, 1, 0, 0}};
  EXPECT_EQ(PickReplica(w, {0, 1}, window), 1u);
  w[1].outstanding = 4;  // full
  EXPECT_EQ(PickReplica(w, {0, 1}, window), 0u);
  w[0].pending_bytes = 1000;  // full by bytes
  EXPECT_EQ(PickReplica(w, {0, 1}, window), kNone);
  w[2].pending_bytes = 5000;
  EXPECT_EQ(PickReplica(w, {2}, window), 2u) << "a worker with nothing outstanding always has room";
}

TEST(PlacementTest, TheReplicaOnTheMostCrowdedWorkerLeavesFirst) {
  std::vector<WorkerView> w = {{0, true, 1, 0, 0}, {1, true, 3, 0, 0}, {2, true, 3, 2, 0}};
  EXPECT_EQ(PickReplicaToDrop(w, {0, 1, 2}), 2u);
  EXPECT_EQ(PickReplicaToDrop(w, {0, 1}), 1u);
}

TEST(PlacementTest, AnIdleWorkerTakesAModelFromOneHoldingSeveral) {
  std::vector<WorkerView> w = {{0, true, 2, 1, 0}, {1, true, 0, 0, 0}};
  std::vector<PlacedModel> models = {{7, {0}, true, 0}, {8, {0}, true, 3}};
  std::optional<Move> move = PlanRebalance(w, models);
  ASSERT_TRUE(move.has_value());
  EXPECT_EQ(move->model, 8u) << "the one with requests waiting";
  EXPECT_EQ(move->from, 0u);
  EXPECT_EQ(move->to, 1u);
  models[1].movable = false;
  EXPECT_EQ(PlanRebalance(w, models)->model, 7u);
  w[1].up = false;
  EXPECT_FALSE(PlanRebalance(w, models)) << "no idle worker up";
  w[1].up = true;
  w[0].models = 1;
  EXPECT_FALSE(PlanRebalance(w, models)) << "nobody holds several";
}

TEST(PlacementTest, AReplicaOfAModelWithSeveralMovesFromItsMostCrowdedWorker) {
  // Two models with two replicas each on workers 0 and 1 (worker 1 also holds a third model),
  // worker 2 idle: one replica moves there, from worker 1.
  std::vector<WorkerView> w = {{0, true, 2, 0, 0}, {1, true, 3, 0, 0}, {2, true, 0, 0, 0}};
  std::vector<PlacedModel> models = {{7, {0, 1}, true, 0}, {8, {1, 0}, true, 0}, {9, {1}, false, 0}};
  std::optional<Move> move = PlanRebalance(w, models);
  ASSERT_TRUE(move.has_value());
  EXPECT_EQ(move->model, 7u);
  EXPECT_EQ(move->from, 1u);
  EXPECT_EQ(move->to, 2u);
}

// cuda: a device's memory owner that died starts again after the workers' backoff, with its own
// settings (it restarts in 100 ms unless it keeps dying young).
TEST(DeviceOwnerPolicyTest, AnOwnerThatDiesYoungWaitsLongerEachTimeOneThatLivedStartsSoon) {
  const RetrySettings& s = kOwnerRespawn;
  EXPECT_EQ(RespawnDelay(0, 50, s), 100u);
  EXPECT_EQ(RespawnDelay(100, 50, s), 200u);
  EXPECT_EQ(RespawnDelay(16000, 50, s), 30000u);
  EXPECT_EQ(RespawnDelay(30000, 50, s), 30000u);
  EXPECT_EQ(RespawnDelay(30000, s.respawn_stable_ms, s), 100u);
}

TEST(DeviceOwnerPolicyTest, AGrantGoesToTheOwnerUnlessItCannotRunKeepsDyingOrPassesTheBudget) {
  GrantAsk ask;
  ask.slot = 3;
  ask.device = 1;
  ask.bytes = 600;
  ask.held = 300;
  ask.budget = 1000;
  EXPECT_TRUE(AdmitGrant(ask).ok());
  ask.owner_running = false;
  ask.owner_restart_delay_ms = kOwnerPatienceMs;
  EXPECT_TRUE(AdmitGrant(ask).ok()) << "it waits for an owner that is back within the patience";

  GrantAsk dying = ask;
  dying.owner_restart_delay_ms = kOwnerPatienceMs + 1;
  EXPECT_EQ(AdmitGrant(dying).code(), Code::kUnavailable);
  EXPECT_NE(AdmitGrant(dying).message().find("keeps dying"), std::string::npos);

  GrantAsk fatal = ask;
  fatal.owner_fatal = true;
  EXPECT_EQ(AdmitGrant(fatal).code(), Code::kUnavailable);
  EXPECT_NE(AdmitGrant(fatal).message().find("cannot run"), std::string::npos);

  GrantAsk greedy = ask;
  greedy.bytes = 701;  // 300 held + 701 > 1000
  EXPECT_EQ(AdmitGrant(greedy).code(), Code::kResourceExhausted);
  EXPECT_NE(AdmitGrant(greedy).message().find("worker 3"), std::string::npos);
  greedy.budget = 0;  // unlimited
  EXPECT_TRUE(AdmitGrant(greedy).ok());
}

}  // namespace
}  // namespace warmpool::supervisor::policy
