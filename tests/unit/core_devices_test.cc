// Several devices: each has its own workers, budget and models. Loads and unparks go where there
// is room, eviction happens on one device (the one whose models were used least recently),
// replicas and moves stay on the weights' device, and a lost device takes only its own models
// with it (tests/unit/core_rig.h checks the segment and the core's invariants after every event,
// among them that no replica sits on another device's worker).
#include "tests/unit/core_rig.h"

namespace warmpool::supervisor::testing {
namespace {

// Two devices of `budget` each, `per_device` workers each, all up.
struct TwoDevices {
  explicit TwoDevices(uint32_t per_device, uint64_t budget = 1000, Config c = CoreRig::SmallConfig())
      : rig(Configure(std::move(c), per_device, budget)) {}
  static Config Configure(Config c, uint32_t per_device, uint64_t budget) {
    c.workers_per_device = per_device;
    c.budget_bytes = budget;
    c.devices = {DeviceConfig{"gpu0", 4000, budget}, DeviceConfig{"gpu1", 4000, budget}};
    return c;
  }
  void Start(std::vector<ModelEntry> entries) {
    rig.Start(std::move(entries));
    for (uint32_t slot = 0; slot < rig.view().max_workers(); slot++) rig.Up(slot);
  }
  CoreRig rig;
};

// The load for `entry` went to worker `slot`: it finishes there with weights `handle`.
void LoadsOn(CoreRig& rig, uint32_t slot, const ModelEntry& entry, int handle) {
  rig.Load(1, entry.name);
  std::vector<v1::WorkerEnvelope> sent = rig.Sent(slot);
  ASSERT_EQ(sent.size(), 1u) << "the load of \"" << entry.name << "\" goes to worker " << slot;
  ASSERT_TRUE(sent[0].has_load());
  rig.Reply(slot, CoreRig::LoadDone(sent[0].load().job(), entry), {handle});
  ASSERT_EQ(rig.State(entry.name), shm::ModelState::kReady);
}

TEST(CoreDevicesTest, LoadsGoToTheDeviceWithTheMostRoom) {
  TwoDevices two(/*per_device=*/1);
  CoreRig& rig = two.rig;
  ModelEntry a = Entry("a", 300, 0), b = Entry("b", 200, 0), c = Entry("c", 100, 0);
  two.Start({a, b, c});
  LoadsOn(rig, 0, a, 100);  // both empty: the first
  LoadsOn(rig, 1, b, 101);  // 1000 left on device 1, 700 on device 0
  LoadsOn(rig, 1, c, 102);  // 800 left on device 1
  EXPECT_EQ(rig.Used(0), 300u);
  EXPECT_EQ(rig.Used(1), 300u);
  EXPECT_EQ(rig.DeviceOf("a"), 0u);
  EXPECT_EQ(rig.DeviceOf("c"), 1u);
  EXPECT_EQ(rig.view().worker(1).device, 1u);
}

TEST(CoreDevicesTest, EvictionHappensOnTheDeviceWhoseModelsWereUsedLeastRecently) {
  TwoDevices two(/*per_device=*/1, /*budget=*/500);
  CoreRig& rig = two.rig;
  ModelEntry a = Entry("a", 400, 0), b = Entry("b", 400, 0), c = Entry("c", 400, 0);
  two.Start({a, b, c});
  LoadsOn(rig, 0, a, 100);
  LoadsOn(rig, 1, b, 101);
  // "a" is used after "b" was loaded: "b" is the least recently used.
  rig.Infer(2, "a");
  std::vector<v1::WorkerEnvelope> to0 = rig.Sent(0);
  ASSERT_EQ(to0.size(), 1u);
  rig.Reply(0, CoreRig::InferDone(to0[0].infer().job()));
  ASSERT_EQ(rig.Replies(2).size(), 1u);

  rig.Load(1, "c");
  EXPECT_TRUE(rig.Sent(0).empty()) << "nothing happens on device 0";
  std::vector<v1::WorkerEnvelope> to1 = rig.Sent(1);
  ASSERT_EQ(to1.size(), 1u);
  ASSERT_TRUE(to1[0].has_unload()) << "\"b\" makes room on device 1";
  EXPECT_EQ(to1[0].unload().model(), rig.index().Find("b"));
  rig.Reply(1, CoreRig::UnloadDone(to1[0].unload().job()));
  to1 = rig.Sent(1);
  ASSERT_EQ(to1.size(), 1u);
  ASSERT_TRUE(to1[0].has_load()) << "and \"c\" loads where it made room";
  EXPECT_EQ(to1[0].load().name(), "c");
  EXPECT_EQ(rig.State("a"), shm::ModelState::kReady);
  EXPECT_EQ(rig.State("b"), shm::ModelState::kRegistered);
  // One eviction for one load: asking again while the release is under way evicted nothing more.
  EXPECT_EQ(rig.index().Get(rig.index().Find("a")).evictions, 0u);
}

TEST(CoreDevicesTest, ReplicasAndMovesStayOnTheirWeightsDevice) {
  Config c = CoreRig::SmallConfig();
  ModelConfig wide;
  wide.name = "m";
  wide.path = "/models/m.safetensors";
  wide.replicas = 4;  // more than a device has workers
  c.models.push_back(wide);
  TwoDevices two(/*per_device=*/2, /*budget=*/1000, c);
  CoreRig& rig = two.rig;
  ModelEntry m = Entry("m", 100, 10);
  two.Start({m});
  rig.Load(1, "m");
  std::vector<v1::WorkerEnvelope> to0 = rig.Sent(0);
  ASSERT_EQ(to0.size(), 1u);
  rig.Reply(0, CoreRig::LoadDone(to0[0].load().job(), m), {100});
  std::vector<v1::WorkerEnvelope> to1 = rig.Sent(1);
  ASSERT_EQ(to1.size(), 1u) << "the second replica is on device 0's other worker";
  EXPECT_TRUE(to1[0].has_attach());
  EXPECT_TRUE(rig.Sent(2).empty()) << "device 1's workers cannot map device 0's memory";
  EXPECT_TRUE(rig.Sent(3).empty());
  rig.Reply(1, CoreRig::LoadDone(to1[0].attach().job(), m, false));
  EXPECT_EQ(rig.index().Get(rig.index().Find("m")).replicas, 2u);
  EXPECT_EQ(rig.Used(0), 100u + 2 * 10);
  EXPECT_EQ(rig.Used(1), 0u);
}

TEST(CoreDevicesTest, AParkedModelUnparksOnAnyDeviceWithRoom) {
  Config c = CoreRig::SmallConfig();
  c.park_budget_bytes = 800;  // room for the copy of "p", not for one of "big" too
  TwoDevices two(/*per_device=*/1, /*budget=*/500, c);
  CoreRig& rig = two.rig;
  ModelEntry p = Entry("p", 400, 0), big = Entry("big", 450, 0), other = Entry("other", 300, 0);
  two.Start({p, big, other});
  LoadsOn(rig, 0, p, 100);
  rig.Unload(1, "p", /*park=*/true);
  std::vector<v1::WorkerEnvelope> to0 = rig.Sent(0);
  ASSERT_EQ(to0.size(), 2u);
  rig.Reply(0, CoreRig::ParkDone(to0[0].park().job(), 400), {200});
  rig.Reply(0, CoreRig::UnloadDone(to0[1].unload().job()));
  ASSERT_EQ(rig.State("p"), shm::ModelState::kParked);
  LoadsOn(rig, 0, big, 101);    // device 0: 450 of 500
  LoadsOn(rig, 1, other, 102);  // device 1: 300 of 500, the most room left
  rig.Load(1, "p");
  EXPECT_TRUE(rig.Sent(1).empty());
  // Neither device has room for 400 without an eviction; "big" (device 0) is the least recently
  // used, so the copy comes back there.
  to0 = rig.Sent(0);
  ASSERT_EQ(to0.size(), 1u);
  ASSERT_TRUE(to0[0].has_unload());
  rig.Reply(0, CoreRig::UnloadDone(to0[0].unload().job()));
  to0 = rig.Sent(0);
  ASSERT_EQ(to0.size(), 1u);
  ASSERT_TRUE(to0[0].has_attach());
  EXPECT_TRUE(to0[0].attach().copy()) << "an unpark, from the host copy";
  EXPECT_EQ(rig.DeviceOf("p"), 0u);
}

TEST(CoreDevicesTest, ALostDeviceTakesOnlyItsOwnModels) {
  TwoDevices two(/*per_device=*/2);
  CoreRig& rig = two.rig;
  ModelEntry a = Entry("a", 300, 0), b = Entry("b", 300, 0);
  two.Start({a, b});
  LoadsOn(rig, 0, a, 100);
  LoadsOn(rig, 2, b, 101);
  rig.Forget();
  rig.Handle(event::DeviceLost{1, "killed by signal 9"});
  EXPECT_EQ(rig.Count<action::KillWorker>(), 2u) << "device 1's two workers, no other";
  EXPECT_EQ(rig.State("a"), shm::ModelState::kReady) << "device 0's model stays warm";
  rig.Down(2);
  rig.Down(3);
  EXPECT_EQ(rig.Closed(), (std::vector<int>{101})) << "only the dead device's weights are let go";
  EXPECT_EQ(rig.State("b"), shm::ModelState::kRegistered);
  EXPECT_EQ(rig.Used(0), 300u);
  EXPECT_EQ(rig.Used(1), 0u);
  // Until device 1's memory owner is back, "b" loads on device 0, even with device 1's workers up
  // again and its room the larger.
  rig.Sent(2);  // what went to the killed workers
  rig.Sent(3);
  rig.Advance(500);
  rig.Up(2);
  rig.Up(3);
  rig.Load(1, "b");
  std::vector<v1::WorkerEnvelope> sent = rig.Sent(1);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_TRUE(sent[0].has_load());
  rig.Handle(event::DeviceRestored{1});
  EXPECT_TRUE(rig.Sent(2).empty()) << "nothing to do on device 1 once it is back";
}

TEST(CoreDevicesTest, ALoadWaitsForTheOnlyDeviceToComeBack) {
  Config c = CoreRig::SmallConfig();
  c.workers_per_device = 1;
  CoreRig rig(c);
  ModelEntry a = Entry("a", 300, 0);
  rig.Start({a});
  rig.Up(0);
  rig.Handle(event::DeviceLost{0, "killed by signal 9"});
  rig.Down(0);
  rig.Advance(500);
  rig.Up(0);
  rig.Load(1, "a");
  EXPECT_TRUE(rig.Sent(0).empty()) << "its memory owner is not back";
  EXPECT_TRUE(rig.Replies(1).empty()) << "the load waits, it does not fail";
  rig.Handle(event::DeviceRestored{0});
  std::vector<v1::WorkerEnvelope> sent = rig.Sent(0);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_TRUE(sent[0].has_load());
}

TEST(CoreDevicesTest, WithNoDeviceLeftALoadIsAnsweredNotLeftWaiting) {
  Config c = CoreRig::SmallConfig();
  c.workers_per_device = 1;
  CoreRig rig(c);
  ModelEntry a = Entry("a", 300, 0);
  rig.Start({a});
  rig.Up(0);
  rig.Handle(event::DeviceLost{0, "exited with status 2", /*for_good=*/true});
  rig.Down(0);
  rig.Load(1, "a");
  std::vector<v1::Envelope> replies = rig.Replies(1);
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_EQ(replies[0].error().code(), v1::UNAVAILABLE) << replies[0].DebugString();
  EXPECT_NE(replies[0].error().message().find("no device can serve models"), std::string::npos);
}

TEST(CoreDevicesTest, HeldWeightsOnADeviceThatCanNoLongerServeAreLoadedElsewhere) {
  TwoDevices two(/*per_device=*/1);
  CoreRig& rig = two.rig;
  ModelEntry a = Entry("a", 300, 0);
  two.Start({a});
  LoadsOn(rig, 0, a, 100);
  // Device 0's only worker exits with status 2 (fatal configuration): the weights it held are
  // still there, but no worker will map them again.
  rig.Down(0, {}, /*fatal=*/true);
  rig.Infer(2, "a");
  EXPECT_EQ(rig.Closed(), (std::vector<int>{100})) << "the stranded weights are let go";
  std::vector<v1::WorkerEnvelope> to1 = rig.Sent(1);
  ASSERT_EQ(to1.size(), 1u);
  EXPECT_TRUE(to1[0].has_load()) << "and the model loads on device 1";
  EXPECT_EQ(rig.DeviceOf("a"), 1u);
}

TEST(CoreDevicesTest, NothingIsPlacedOnADeviceLostForGood) {
  TwoDevices two(/*per_device=*/1);
  CoreRig& rig = two.rig;
  ModelEntry a = Entry("a", 300, 0), b = Entry("b", 300, 0);
  two.Start({a, b});
  rig.Handle(event::DeviceLost{0, "exited with status 2", /*for_good=*/true});
  rig.Down(0);
  rig.Advance(1000);
  rig.Up(0);
  rig.Sent(0);
  LoadsOn(rig, 1, a, 100);
  LoadsOn(rig, 1, b, 101);  // device 0 is empty, and still not chosen
  EXPECT_EQ(rig.Used(0), 0u);
  EXPECT_EQ(rig.Used(1), 600u);
}

}  // namespace
}  // namespace warmpool::supervisor::testing
