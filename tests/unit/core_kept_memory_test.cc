// Memory the core let go of and keeps for reuse (supervisor/core/kept_memory.h): which region a
// job that allocates is offered, what goes so that used + kept fits the budget, and what is never
// kept. The rig checks Core::CheckInvariants (used + kept <= budget, no region both kept and held)
// after every event.
#include "tests/unit/core_rig.h"

namespace warmpool::supervisor::testing {
namespace {

struct Frame {
  uint32_t slot = 0;
  v1::WorkerEnvelope message;
  int offer = -1;
};

// The frames sent to any worker since the last Forget (they stay in the rig).
std::vector<Frame> Frames(const CoreRig& rig) {
  std::vector<Frame> out;
  for (const action::SendToWorker& s : rig.Of<action::SendToWorker>()) {
    Frame f{s.slot, {}, s.offer};
    EXPECT_TRUE(f.message.ParseFromArray(s.frame.data() + ipc::kFramePrefixBytes,
                                         static_cast<int>(s.frame.size() - ipc::kFramePrefixBytes)));
    out.push_back(std::move(f));
  }
  return out;
}

// Loads `m` on whichever worker the core picks; its weights come back as `handle`.
void LoadAnywhere(CoreRig& rig, const ModelEntry& m, int handle) {
  rig.Forget();
  rig.Load(1, m.name);
  for (const Frame& f : Frames(rig)) {
    if (f.message.has_load()) return rig.Reply(f.slot, CoreRig::LoadDone(f.message.load().job(), m), {handle});
  }
  ADD_FAILURE() << "no load of " << m.name << " was sent";
}

// Unloads `m` and answers every worker that lets go of it.
void UnloadEverywhere(CoreRig& rig, const std::string& name) {
  rig.Forget();
  rig.Unload(1, name);
  for (const Frame& f : Frames(rig)) {
    if (f.message.has_unload()) rig.Reply(f.slot, CoreRig::UnloadDone(f.message.unload().job()));
  }
}

std::vector<int> Kept(const Core& core) {
  std::vector<int> out;
  for (const KeptMemory::Region& r : core.kept_memory().regions()) out.push_back(r.handle);
  return out;
}

CoreRig StartedRig(const std::vector<ModelEntry>& models, std::vector<KeptWeights> kept = {}) {
  CoreRig rig(CoreRig::SmallConfig());  // budget 1000
  rig.Start(models, std::move(kept));
  rig.Up(0);
  rig.Up(1);
  return rig;
}

// The switch the ledger exists for: a budget that holds one model, a request for the other. The
// eviction frees exactly what the load needs, and the load is offered that very region.
TEST(CoreKeptMemoryTest, ASwitchUnderAFullBudgetIsOfferedTheMemoryItsEvictionFreed) {
  ModelEntry a = Entry("a", 800, 100), b = Entry("b", 800, 100);
  CoreRig rig = StartedRig({a, b});
  LoadAnywhere(rig, a, 100);
  rig.Forget();
  rig.Infer(2, "b");  // a must go first
  std::vector<Frame> frames = Frames(rig);
  ASSERT_EQ(frames.size(), 1u);
  ASSERT_TRUE(frames[0].message.has_unload()) << "the eviction of a";
  rig.Forget();
  rig.Reply(frames[0].slot, CoreRig::UnloadDone(frames[0].message.unload().job()));
  std::vector<action::CloseHandle> closed = rig.Of<action::CloseHandle>();
  ASSERT_EQ(closed.size(), 1u);
  EXPECT_EQ(closed[0].handle, 100);
  EXPECT_TRUE(closed[0].keep) << "a's weights are kept for the next allocation";
  frames = Frames(rig);
  ASSERT_EQ(frames.size(), 1u);
  ASSERT_TRUE(frames[0].message.has_load());
  EXPECT_EQ(frames[0].offer, 100) << "b's load is offered a's pages";
  EXPECT_EQ(rig.Count<action::DropKept>(), 0u);
  EXPECT_TRUE(Kept(rig.core()).empty()) << "counted once: as b's, no longer as kept";
}

TEST(CoreKeptMemoryTest, WhatTheBudgetCannotHoldBesideWhatIsUsedGoesOldestFirst) {
  ModelEntry a = Entry("a", 300, 0), b = Entry("b", 300, 0), c = Entry("c", 300, 0), big = Entry("big", 900, 0);
  CoreRig rig = StartedRig({a, b, c, big});
  LoadAnywhere(rig, a, 100);
  LoadAnywhere(rig, b, 101);
  LoadAnywhere(rig, c, 102);
  UnloadEverywhere(rig, "a");
  UnloadEverywhere(rig, "b");
  EXPECT_EQ(Kept(rig.core()), (std::vector<int>{100, 101})) << "300 used + 600 kept fit 1000";
  EXPECT_EQ(rig.core().kept_memory().bytes(), 600u);
  UnloadEverywhere(rig, "c");
  EXPECT_EQ(Kept(rig.core()), (std::vector<int>{100, 101, 102}));

  // 900 bytes: no kept region is that large, so the largest (the oldest of equals) is offered and
  // grown; the rest goes, oldest first, until 900 used + kept fit.
  rig.Forget();
  rig.Load(1, "big");
  std::vector<Frame> frames = Frames(rig);
  ASSERT_EQ(frames.size(), 1u);
  EXPECT_EQ(frames[0].offer, 100);
  std::vector<action::DropKept> dropped = rig.Of<action::DropKept>();
  ASSERT_EQ(dropped.size(), 2u);
  EXPECT_EQ(dropped[0].handle, 101);
  EXPECT_EQ(dropped[1].handle, 102);
  EXPECT_TRUE(Kept(rig.core()).empty());
}

TEST(CoreKeptMemoryTest, AnAdoptedRegionIsNeverKeptNorIsAnythingOnceATakeoverIsUnderWay) {
  ModelEntry a = Entry("a", 300, 0), b = Entry("b", 300, 0);
  KeptWeights adopted;
  adopted.name = "a";
  adopted.engine = a.engine;
  adopted.path = a.path;
  adopted.weights.handle = 100;
  adopted.weights.header = a.header;
  adopted.weights.file_size = a.file_size;
  adopted.weights.version = a.version;
  adopted.weights.weight_bytes = a.weight_bytes;
  adopted.weights.in_features = a.in_features;
  adopted.weights.out_features = a.out_features;
  CoreRig rig = StartedRig({a, b}, {adopted});
  ASSERT_EQ(rig.core().adopted(), 1u);
  UnloadEverywhere(rig, "a");
  std::vector<action::CloseHandle> closed = rig.Of<action::CloseHandle>();
  ASSERT_EQ(closed.size(), 1u);
  EXPECT_EQ(closed[0].handle, 100);
  EXPECT_FALSE(closed[0].keep) << "the daemon before this one kept it: its workers may still map it";

  LoadAnywhere(rig, b, 101);
  UnloadEverywhere(rig, "b");
  ASSERT_EQ(Kept(rig.core()), (std::vector<int>{101}));
  rig.Forget();
  rig.Handle(event::HandingOver{});
  std::vector<action::DropKept> dropped = rig.Of<action::DropKept>();
  ASSERT_EQ(dropped.size(), 1u);
  EXPECT_EQ(dropped[0].handle, 101) << "the new daemon maps it from now on";
  LoadAnywhere(rig, b, 102);
  UnloadEverywhere(rig, "b");
  closed = rig.Of<action::CloseHandle>();
  ASSERT_EQ(closed.size(), 1u);
  EXPECT_FALSE(closed[0].keep);
  EXPECT_TRUE(Kept(rig.core()).empty());
}

}  // namespace
}  // namespace warmpool::supervisor::testing
