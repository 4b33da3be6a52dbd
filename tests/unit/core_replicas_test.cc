// Replicas that attach or leave while their model changes under them (unloaded, parked, unparked,
// reloaded, removed): the races the simulator found, each written down as the exact sequence of
// events that used to break it (tests/unit/core_rig.h checks the segment and the core's own
// invariants after every event).
#include <algorithm>

#include "tests/unit/core_rig.h"

namespace warmpool::supervisor::testing {
namespace {

// Two workers up; `m` loaded by worker 0 (weights handle 100) with a second replica asked for:
// the attach on worker 1 is sent and not yet answered. Its job id.
uint64_t ReadyWithAReplicaAttaching(CoreRig& rig, const ModelEntry& m) {
  rig.Start({m});
  rig.Up(0);
  rig.Up(1);
  rig.Loaded(0, m, 100, /*replicas=*/2);
  std::vector<v1::WorkerEnvelope> to1 = rig.Sent(1);
  EXPECT_EQ(to1.size(), 1u);
  if (to1.empty()) return 0;
  EXPECT_TRUE(to1[0].has_attach());
  return to1[0].attach().job();
}

// An extra replica still attaching when its model is unloaded: its unload follows its attach in
// the same channel; the model leaves residency once both replicas have let go, the weights are
// closed exactly once and only then, and nothing stays in the account.
TEST(CoreTest, AReplicaAttachingWhenItsModelIsUnloadedLeavesNothingBehind) {
  CoreRig rig(CoreRig::SmallConfig());
  ModelEntry m = Entry("m", 100, 10);
  uint64_t attach = ReadyWithAReplicaAttaching(rig, m);
  EXPECT_EQ(rig.Used(), 120u) << "weights once, a workspace per replica (attaching too)";
  rig.Forget();
  rig.Unload(2, "m");
  std::vector<v1::WorkerEnvelope> to0 = rig.Sent(0), to1 = rig.Sent(1);
  ASSERT_EQ(to0.size(), 1u);
  ASSERT_EQ(to1.size(), 1u) << "the attaching replica is told to let go too";
  EXPECT_TRUE(to1[0].has_unload());
  rig.Reply(1, CoreRig::LoadDone(attach, m, /*shared=*/false));  // the attach lands late
  EXPECT_TRUE(rig.Closed().empty()) << "no handle closed while a worker may still map it";
  rig.Reply(0, CoreRig::UnloadDone(to0[0].unload().job()));
  EXPECT_TRUE(rig.Closed().empty());
  rig.Reply(1, CoreRig::UnloadDone(to1[0].unload().job()));
  EXPECT_EQ(rig.Closed(), (std::vector<int>{100}));
  EXPECT_EQ(rig.State("m"), shm::ModelState::kRegistered);
  EXPECT_EQ(rig.Used(), 0u);
  std::vector<v1::Envelope> replies = rig.Replies(2);
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_TRUE(replies[0].has_unload_reply());
}

// The same race with park: the late attach neither brings the model back to the device nor loses
// the parked copy; the device weights are closed once both replicas have let go.
TEST(CoreTest, AReplicaAttachingWhenItsModelIsParkedLeavesOneParkedCopy) {
  Config c = CoreRig::SmallConfig();
  c.park_budget_bytes = 1000;
  CoreRig rig(c);
  ModelEntry m = Entry("m", 100, 10);
  uint64_t attach = ReadyWithAReplicaAttaching(rig, m);
  rig.Forget();
  rig.Unload(2, "m", /*park=*/true);
  std::vector<v1::WorkerEnvelope> to0 = rig.Sent(0), to1 = rig.Sent(1);
  ASSERT_EQ(to0.size(), 2u);
  ASSERT_TRUE(to0[0].has_park()) << "the serving replica copies the weights out ...";
  ASSERT_TRUE(to0[1].has_unload()) << "... then lets them go";
  ASSERT_EQ(to1.size(), 1u);
  ASSERT_TRUE(to1[0].has_unload()) << "the attaching one is told to let go";
  rig.Reply(1, CoreRig::LoadDone(attach, m, /*shared=*/false));  // the attach lands late
  EXPECT_NE(rig.State("m"), shm::ModelState::kReady);
  rig.Reply(0, CoreRig::ParkDone(to0[0].park().job(), 100), {200});
  rig.Reply(0, CoreRig::UnloadDone(to0[1].unload().job()));
  EXPECT_TRUE(rig.Closed().empty()) << "worker 1 may still map the device weights";
  rig.Reply(1, CoreRig::UnloadDone(to1[0].unload().job()));
  EXPECT_EQ(rig.Closed(), (std::vector<int>{100})) << "the device weights, not the parked copy";
  EXPECT_EQ(rig.State("m"), shm::ModelState::kParked);
  EXPECT_EQ(rig.Used(), 0u);
  EXPECT_EQ(rig.index().ParkUsed(), 100u);
  std::vector<v1::Envelope> replies = rig.Replies(2);
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_TRUE(replies[0].has_unload_reply());
}

// An unpark allocates the parked copy's bytes, which is what the shell offers kept memory for: a
// size read from the Parked state after the transition to Unparking had moved the copy out of it
// offered the kept region shrunk to a few bytes, and every unpark faulted in fresh memory.
TEST(CoreTest, AnUnparkAllocatesWhatTheParkedCopyHolds) {
  Config c = CoreRig::SmallConfig();
  c.park_budget_bytes = 1000;
  CoreRig rig(c);
  ModelEntry m = Entry("m", 100, 10);
  rig.Start({m});
  rig.Up(0);
  rig.Loaded(0, m, 100);
  rig.Forget();
  rig.Unload(2, "m", /*park=*/true);
  std::vector<v1::WorkerEnvelope> to0 = rig.Sent(0);
  ASSERT_EQ(to0.size(), 2u);
  ASSERT_TRUE(to0[0].has_park());
  rig.Reply(0, CoreRig::ParkDone(to0[0].park().job(), 100), {200});
  rig.Reply(0, CoreRig::UnloadDone(to0[1].unload().job()));
  ASSERT_EQ(rig.State("m"), shm::ModelState::kParked);
  rig.Forget();
  rig.Load(2, "m");
  std::vector<action::SendToWorker> sends = rig.SendsTo(0);
  ASSERT_EQ(sends.size(), 1u);
  EXPECT_EQ(sends[0].allocates, 100u) << "the copy's weight bytes";  // CheckAllocation agrees (rig)
  EXPECT_EQ(sends[0].handles, (std::vector<int>{200})) << "the parked copy goes with it";
}

// And with a reload that changed the file: the late attach serves nothing of the old version,
// the new version is loaded once, after the old one has let go, and requests get the new one.
TEST(CoreTest, AReplicaAttachingWhenItsModelIsReloadedServesNothingOld) {
  CoreRig rig(CoreRig::SmallConfig());
  ModelEntry old_version = Entry("m", 100, 10, 1), new_version = Entry("m", 200, 10, 2);
  uint64_t attach = ReadyWithAReplicaAttaching(rig, old_version);
  rig.Forget();
  event::Reload reload;
  reload.config = CoreRig::SmallConfig();
  reload.entries = {new_version};
  rig.Handle(std::move(reload));
  rig.Reply(1, CoreRig::LoadDone(attach, old_version, /*shared=*/false));  // the old version, late
  rig.Infer(3, "m");
  bool loaded = false, ran = false;
  for (int round = 0; round < 4; round++) {
    for (uint32_t slot : {0u, 1u}) {
      for (const v1::WorkerEnvelope& w : rig.Sent(slot)) {
        if (w.has_infer()) {
          EXPECT_TRUE(loaded) << "nothing runs before the new version is loaded";
          ran = true;
        }
        if (w.has_attach()) {  // a replica for the waiting request: the new version's
          EXPECT_EQ(w.attach().weights().header(), new_version.header) << "the old weights go nowhere new";
          rig.Reply(slot, CoreRig::LoadDone(w.attach().job(), new_version, /*shared=*/false));
        }
        if (w.has_unload()) rig.Reply(slot, CoreRig::UnloadDone(w.unload().job()));
        if (w.has_load()) {
          EXPECT_FALSE(loaded) << "one load of the new version";
          EXPECT_EQ(w.load().admitted_bytes(), 210u) << "admitted as the new file";
          EXPECT_EQ(rig.Closed(), (std::vector<int>{100})) << "the old weights went first";
          rig.Reply(slot, CoreRig::LoadDone(w.load().job(), new_version), {101});
          loaded = true;
        }
      }
    }
  }
  EXPECT_EQ(rig.State("m"), shm::ModelState::kReady);
  EXPECT_TRUE(ran) << "the waiting request runs on the new version";
}

// A reload changes the model while a request runs on it (a new request waits for the new version),
// and the next reload removes it before the new version registered. The waiting request is not
// served by the version leaving, which is older than the one registered when it came.
TEST(CoreTest, ARequestWaitingForANewVersionIsNotServedByTheOldOneWhenTheModelIsRemoved) {
  CoreRig rig(CoreRig::SmallConfig());
  ModelEntry old_version = Entry("m", 100, 10, 1), new_version = Entry("m", 200, 10, 2);
  rig.Start({old_version});
  rig.Up(0);
  rig.Loaded(0, old_version, 100);
  rig.Forget();
  rig.Infer(2, "m");
  std::vector<v1::WorkerEnvelope> sent = rig.Sent(0);
  ASSERT_EQ(sent.size(), 1u);
  ASSERT_TRUE(sent[0].has_infer());
  const uint64_t running = sent[0].infer().job();
  event::Reload changed;
  changed.config = CoreRig::SmallConfig();
  changed.entries = {new_version};
  rig.Handle(std::move(changed));
  rig.Infer(3, "m");  // waits for the new version
  event::Reload removed;
  removed.config = CoreRig::SmallConfig();
  rig.Handle(std::move(removed));
  std::vector<v1::Envelope> replies = rig.Replies(3);
  ASSERT_EQ(replies.size(), 1u) << "answered when the version it waits for is gone";
  EXPECT_EQ(replies[0].error().code(), v1::NOT_FOUND) << replies[0].ShortDebugString();
  rig.Forget();
  rig.Reply(0, CoreRig::InferDone(running));  // what ran on the old version finishes
  EXPECT_EQ(rig.Replies(2).size(), 1u);
  for (int round = 0; round < 3; round++) {
    for (const v1::WorkerEnvelope& w : rig.Sent(0)) {
      EXPECT_FALSE(w.has_infer()) << "nothing more runs on the old version";
      if (w.has_unload()) rig.Reply(0, CoreRig::UnloadDone(w.unload().job()));
      if (w.has_park()) rig.Reply(0, CoreRig::ParkDone(w.park().job(), 100), {101});
    }
  }
  EXPECT_EQ(rig.index().Find("m"), shm::kNil) << "forgotten once its work ended";
}

// A shrink to one replica sends the other away; the one that stays dies with a request before the
// leaving one has let go. The request is not left waiting: once the leaving replica is gone, a
// worker attaches the held weights and serves it.
TEST(CoreTest, ARequestIsServedWhenTheOnlyReplicaLeftIsLeaving) {
  CoreRig rig(CoreRig::SmallConfig());
  ModelEntry m = Entry("m", 100, 10);
  uint64_t attach = ReadyWithAReplicaAttaching(rig, m);
  rig.Reply(1, CoreRig::LoadDone(attach, m, /*shared=*/false));
  rig.Forget();
  rig.Load(1, "m", /*replicas=*/1);
  std::vector<v1::WorkerEnvelope> to0 = rig.Sent(0), to1 = rig.Sent(1);
  ASSERT_EQ(to0.size() + to1.size(), 1u) << "one replica is sent away";
  uint32_t leaving = to0.empty() ? 1 : 0, staying = 1 - leaving;
  uint64_t unload = (to0.empty() ? to1 : to0)[0].unload().job();
  rig.Infer(2, "m");
  std::vector<v1::WorkerEnvelope> sent = rig.Sent(staying);
  ASSERT_EQ(sent.size(), 1u);
  rig.Down(staying, {sent[0].infer().job()});
  EXPECT_TRUE(rig.Sent(leaving).empty()) << "nothing goes to the replica that is leaving";
  rig.Reply(leaving, CoreRig::UnloadDone(unload));
  sent = rig.Sent(leaving);
  ASSERT_EQ(sent.size(), 1u) << "the held weights are attached again, without waiting for a respawn";
  ASSERT_TRUE(sent[0].has_attach());
  rig.Reply(leaving, CoreRig::LoadDone(sent[0].attach().job(), m, /*shared=*/false));
  sent = rig.Sent(leaving);
  ASSERT_EQ(sent.size(), 1u);
  ASSERT_TRUE(sent[0].has_infer()) << "the request that was running is retried";
  rig.Reply(leaving, CoreRig::InferDone(sent[0].infer().job()));
  std::vector<v1::Envelope> replies = rig.Replies(2);
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_TRUE(replies[0].has_infer_reply()) << replies[0].DebugString();
  EXPECT_TRUE(rig.Closed().empty()) << "the weights stayed held throughout";
}

// The same, with the room the dead replica freed taken by another model before a worker comes
// back: the new attach waits for the leaving replica's workspace instead of going over the budget
// (the rig validates the segment, budget included, after every event).
TEST(CoreTest, ReplacingALeavingReplicaWaitsForItsRoom) {
  CoreRig rig(CoreRig::SmallConfig());  // budget 1000
  ModelEntry m = Entry("m", 100, 10), filler = Entry("f", 890, 0);
  rig.Start({m, filler});
  rig.Up(0);
  rig.Up(1);
  rig.Loaded(0, m, 100, /*replicas=*/2);
  rig.Reply(1, CoreRig::LoadDone(rig.Sent(1)[0].attach().job(), m, /*shared=*/false));
  rig.Load(1, "m", /*replicas=*/1);
  std::vector<v1::WorkerEnvelope> to0 = rig.Sent(0), to1 = rig.Sent(1);
  ASSERT_EQ(to0.size() + to1.size(), 1u);
  uint32_t leaving = to0.empty() ? 1 : 0, staying = 1 - leaving;
  uint64_t unload = (to0.empty() ? to1 : to0)[0].unload().job();
  rig.Infer(2, "m");
  rig.Down(staying, {rig.Sent(staying)[0].infer().job()});
  EXPECT_EQ(rig.Used(), 110u) << "the weights and the leaving replica's workspace";
  rig.Load(3, "f");  // exactly the room the dead replica left
  std::vector<v1::WorkerEnvelope> sent = rig.Sent(leaving);
  ASSERT_EQ(sent.size(), 1u);
  ASSERT_TRUE(sent[0].has_load());
  rig.Reply(leaving, CoreRig::LoadDone(sent[0].load().job(), filler), {101});
  EXPECT_EQ(rig.Used(), 1000u);
  rig.Advance(200);
  rig.Up(staying);
  EXPECT_TRUE(rig.Sent(staying).empty()) << "no room for a second workspace yet";
  rig.Reply(leaving, CoreRig::UnloadDone(unload));
  sent = rig.Sent(staying);
  if (sent.empty()) sent = rig.Sent(leaving);
  ASSERT_EQ(sent.size(), 1u) << "the leaving replica's room goes to the new attach";
  EXPECT_TRUE(sent[0].has_attach());
  EXPECT_EQ(rig.Used(), 1000u);
}

}  // namespace
}  // namespace warmpool::supervisor::testing
