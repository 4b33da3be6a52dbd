// A language model's KV cache in the core (supervisor/core/kv_caches.cc, engine ABI version 11): the
// cache of a replica whose engine closed cleanly while its model parked goes with the host copy,
// within the park budget, and to the worker that unparks it; a supervisor after this one adopts it
// with the copy, or closes it. A GPU's pool (device memory) parks as the host copy its park sent,
// and a dead one goes with a retried stream only where its device has room for it.
#include <algorithm>

#include "tests/unit/core_generations.h"

// Its own namespace: the unity build compiles it with core_adoption_test.cc, whose helpers are alike.
namespace warmpool::supervisor::testing::kv_cache_test {
namespace {

using testing::CoreRig;
using testing::LanguageModel;

constexpr int kWeights = 100, kCache = 150, kCopy = 201, kPoolCopy = 202;

Config WithPark(uint64_t park_budget) {
  Config c = CoreRig::SmallConfig();  // budget 1000
  c.park_budget_bytes = park_budget;
  return c;
}

// Loaded on worker 0 (started, up) with its cache (kCache, `cache_bytes`; `grant` non-zero: a GPU's
// pool, device memory held by that grant).
void LoadWithCache(CoreRig& rig, const ModelEntry& lm, uint64_t cache_bytes, uint64_t grant) {
  rig.Load(1, lm.name);
  std::vector<v1::WorkerEnvelope> load = rig.Sent(0);
  ASSERT_EQ(load.size(), 1u);
  v1::WorkerEnvelope done = CoreRig::LoadDone(load[0].load().job(), lm);
  done.mutable_load_done()->set_cache_shared(true);
  done.mutable_load_done()->set_cache_bytes(cache_bytes);
  done.mutable_load_done()->set_cache_grant(grant);
  rig.Reply(0, done, {kWeights, kCache});
  ASSERT_EQ(rig.State(lm.name), shm::ModelState::kReady);
}

// Loaded on worker 0 with its cache (kCache, `cache_bytes`), then parked: its park and unload done.
// `grant` non-zero: the cache is a GPU's pool, device memory held by that grant; `pool_copy` non-zero:
// the park sends a host copy of it that large (kPoolCopy), after the weights' copy.
void LoadAndPark(CoreRig& rig, const ModelEntry& lm, uint64_t cache_bytes, uint64_t grant = 0,
                 uint64_t pool_copy = 0) {
  rig.Start({lm});
  rig.Up(0);
  LoadWithCache(rig, lm, cache_bytes, grant);
  rig.Forget();
  rig.Unload(1, lm.name, /*park=*/true);
  std::vector<v1::WorkerEnvelope> to0 = rig.Sent(0);
  ASSERT_EQ(to0.size(), 2u);
  ASSERT_TRUE(to0[0].has_park() && to0[1].has_unload());
  v1::WorkerEnvelope parked = CoreRig::ParkDone(to0[0].park().job(), lm.weight_bytes);
  if (pool_copy > 0) {
    parked.mutable_park_done()->set_cache_copy(true);
    parked.mutable_park_done()->set_cache_copy_bytes(pool_copy);
  }
  rig.Reply(0, parked, pool_copy > 0 ? std::vector<int>{kCopy, kPoolCopy} : std::vector<int>{kCopy});
  rig.Reply(0, CoreRig::UnloadDone(to0[1].unload().job()));
  ASSERT_EQ(rig.State(lm.name), shm::ModelState::kParked);
}

// A request unparks the model on worker 0: the copy goes, no cache with it.
void ExpectUnparkWithoutCache(CoreRig& rig) {
  rig.Forget();
  rig.Load(1, "lm");
  std::vector<std::pair<v1::WorkerEnvelope, std::vector<int>>> sent = rig.SentWithHandles(0);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_FALSE(sent[0].first.attach().kv_cache());
  EXPECT_EQ(sent[0].second, (std::vector<int>{kCopy}));
}

bool Closed(CoreRig& rig, int handle) {
  const std::vector<int> closed = rig.Closed();
  return std::find(closed.begin(), closed.end(), handle) != closed.end();
}

TEST(CoreKvCacheTest, AParkedModelKeepsItsCacheAndTheUnparkingWorkerGetsIt) {
  ModelEntry lm = LanguageModel("lm");
  CoreRig rig(WithPark(1000));
  LoadAndPark(rig, lm, 300);
  EXPECT_FALSE(Closed(rig, kCache));
  EXPECT_EQ(rig.index().ParkUsed(), lm.weight_bytes + 300) << "the copy and the cache kept with it";
  const std::vector<KeptWeights> kept = rig.core().Kept();
  ASSERT_EQ(kept.size(), 2u);
  EXPECT_FALSE(kept[0].kv_cache);
  EXPECT_TRUE(kept[1].kv_cache);
  EXPECT_EQ(kept[1].weights.handle, kCache);
  EXPECT_EQ(kept[1].weights.weight_bytes, 300u);
  EXPECT_EQ(kept[1].weights.version, kept[0].weights.version) << "of the copy's weights";

  rig.Forget();
  rig.Load(1, "lm");  // unparks it
  std::vector<std::pair<v1::WorkerEnvelope, std::vector<int>>> sent = rig.SentWithHandles(0);
  ASSERT_EQ(sent.size(), 1u);
  ASSERT_TRUE(sent[0].first.has_attach() && sent[0].first.attach().copy());
  EXPECT_TRUE(sent[0].first.attach().kv_cache());
  EXPECT_EQ(sent[0].second, (std::vector<int>{kCopy, kCache})) << "the copy, then the cache";
  EXPECT_TRUE(Closed(rig, kCache)) << "the worker has its own descriptor: the engine sends it back as its own";
}

TEST(CoreKvCacheTest, ACacheThatDoesNotFitTheParkBudgetIsLetGoAndTheWeightsParkAlone) {
  ModelEntry lm = LanguageModel("lm");
  CoreRig rig(WithPark(lm.weight_bytes + 299));
  LoadAndPark(rig, lm, 300);
  EXPECT_TRUE(Closed(rig, kCache));
  EXPECT_EQ(rig.index().ParkUsed(), lm.weight_bytes);
  ExpectUnparkWithoutCache(rig);
}

// A GPU's cache is device memory: parking frees the device, so it is let go however much room the
// park budget has (only a host copy the park sent is kept: the next tests).
TEST(CoreKvCacheTest, AGpusCacheIsDeviceMemoryAndIsNotKeptToPark) {
  ModelEntry lm = LanguageModel("lm");
  CoreRig rig(WithPark(1000));
  LoadAndPark(rig, lm, 300, /*grant=*/7);
  EXPECT_TRUE(Closed(rig, kCache));
  EXPECT_EQ(rig.index().ParkUsed(), lm.weight_bytes);
  ExpectUnparkWithoutCache(rig);
}

// What a park of a GPU's pool keeps instead: the host copy the worker sent with the weights' copy,
// within the park budget, which goes to the worker that unparks the model.
TEST(CoreKvCacheTest, AGpusPoolParksAsTheHostCopyItsParkSent) {
  ModelEntry lm = LanguageModel("lm");
  CoreRig rig(WithPark(1000));
  LoadAndPark(rig, lm, 300, /*grant=*/7, /*pool_copy=*/300);
  EXPECT_TRUE(Closed(rig, kCache)) << "the pool itself, device memory, is let go";
  EXPECT_FALSE(Closed(rig, kPoolCopy));
  EXPECT_EQ(rig.index().ParkUsed(), lm.weight_bytes + 300) << "the copy and the pool's copy";
  rig.Forget();
  rig.Load(1, "lm");  // unparks it
  std::vector<std::pair<v1::WorkerEnvelope, std::vector<int>>> sent = rig.SentWithHandles(0);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_TRUE(sent[0].first.attach().kv_cache());
  EXPECT_EQ(sent[0].second, (std::vector<int>{kCopy, kPoolCopy}));
}

// The park asks for the pool's copy only where it would be kept; one that comes all the same (a
// budget that changed meanwhile) is let go when it does not fit. Exactly the budget fits.
TEST(CoreKvCacheTest, AGpusPoolIsCopiedOutOnlyWithinTheParkBudget) {
  for (const uint64_t room : {uint64_t{299}, uint64_t{300}}) {
    ModelEntry lm = LanguageModel("lm");
    CoreRig rig(WithPark(lm.weight_bytes + room));
    rig.Start({lm});
    rig.Up(0);
    LoadWithCache(rig, lm, 300, /*grant=*/7);
    rig.Forget();
    rig.Unload(1, lm.name, /*park=*/true);
    std::vector<v1::WorkerEnvelope> to0 = rig.Sent(0);
    ASSERT_EQ(to0.size(), 2u);
    ASSERT_TRUE(to0[0].has_park());
    EXPECT_EQ(to0[0].park().cache_copy(), room == 300) << "room " << room;
    v1::WorkerEnvelope parked = CoreRig::ParkDone(to0[0].park().job(), lm.weight_bytes);
    parked.mutable_park_done()->set_cache_copy(true);
    parked.mutable_park_done()->set_cache_copy_bytes(300);
    rig.Reply(0, parked, {kCopy, kPoolCopy});
    rig.Reply(0, CoreRig::UnloadDone(to0[1].unload().job()));
    EXPECT_EQ(Closed(rig, kPoolCopy), room < 300) << "room " << room;
    EXPECT_EQ(rig.index().ParkUsed(), lm.weight_bytes + (room < 300 ? 0 : 300)) << "room " << room;
  }
}

// Once a daemon taking over has been handed the parked cache, it is that daemon's to write: an
// unpark here while this one drains goes without it.
TEST(CoreKvCacheTest, AfterAHandOverAnUnparkGoesWithoutTheCache) {
  ModelEntry lm = LanguageModel("lm");
  CoreRig rig(WithPark(1000));
  LoadAndPark(rig, lm, 300);
  rig.Handle(event::HandingOver{});
  ExpectUnparkWithoutCache(rig);
  EXPECT_TRUE(Closed(rig, kCache));
}

TEST(CoreKvCacheTest, DroppingTheParkedCopyClosesItsCache) {
  ModelEntry lm = LanguageModel("lm");
  CoreRig rig(WithPark(1000));
  LoadAndPark(rig, lm, 300);
  rig.Forget();
  rig.Unload(1, "lm");  // an unload of a parked model drops the copy
  EXPECT_EQ(rig.State("lm"), shm::ModelState::kRegistered);
  EXPECT_TRUE(Closed(rig, kCache));
  EXPECT_TRUE(Closed(rig, kCopy));
  EXPECT_EQ(rig.index().ParkUsed(), 0u);
}

TEST(CoreKvCacheTest, TheNextCoreAdoptsTheCacheWithItsCopyOrClosesIt) {
  ModelEntry lm = LanguageModel("lm");
  std::vector<KeptWeights> kept;
  {
    CoreRig rig(WithPark(1000));
    LoadAndPark(rig, lm, 300);
    kept = rig.core().Kept();
  }
  ASSERT_EQ(kept.size(), 2u);
  {
    CoreRig rig(WithPark(1000));
    rig.Start({lm}, kept);
    EXPECT_EQ(rig.State("lm"), shm::ModelState::kParked);
    EXPECT_TRUE(rig.Closed().empty());
    EXPECT_EQ(rig.index().ParkUsed(), lm.weight_bytes + 300);
    EXPECT_EQ(rig.core().Kept().size(), 2u) << "and keeps it for the restart after";
  }
  struct Case {
    const char* what;
    uint64_t park_budget;
    bool with_copy;
    int other_version;  // 0: the same weights
  };
  for (const Case& c : {Case{"no room beside the copy", lm.weight_bytes + 299, true, 0},
                        Case{"its copy not kept", 1000, false, 0}, Case{"of other weights", 1000, true, 2}}) {
    SCOPED_TRACE(c.what);
    std::vector<KeptWeights> given = kept;
    if (!c.with_copy) given.erase(given.begin());
    if (c.other_version != 0) given.back().weights.version.mtime_ns += 1;
    CoreRig rig(WithPark(c.park_budget));
    rig.Start({lm}, given);
    EXPECT_TRUE(Closed(rig, kCache));
    EXPECT_EQ(rig.index().ParkUsed(), c.with_copy ? lm.weight_bytes : 0);
  }
}

// A GPU's pool whose worker died: the stream retried on the other replica takes it along (its size
// with it: a device handle has none of its own) while the device has room for it beside all it
// holds, counted there with its model; without that room it is let go at once, and the retried
// stream computes its prompt.
TEST(CoreKvCacheTest, ADeadGpusPoolGoesWithItsStreamOnlyWhereTheDeviceHasRoomForIt) {
  for (const uint64_t pool : {uint64_t{50}, uint64_t{900}}) {
    ModelEntry lm = LanguageModel("lm");
    lm.sequences = 4;  // the other stream on worker 1 leaves it room for the retried one
    CoreRig rig(CoreRig::SmallConfig());  // a budget of 1000
    rig.Start({lm});
    rig.Up(0);
    rig.Up(1);
    LoadWithCache(rig, lm, pool, /*grant=*/7);
    rig.Load(1, lm.name, /*replicas=*/2);
    std::vector<v1::WorkerEnvelope> attach = rig.Sent(1);
    ASSERT_EQ(attach.size(), 1u);
    rig.Reply(1, CoreRig::LoadDone(attach[0].attach().job(), lm));  // no cache of its own
    rig.Forget();
    // Two streams, one a replica, so that worker 0 runs one whichever way they go.
    Generate(rig, 5, "lm");
    Generate(rig, 6, "lm");
    std::vector<v1::WorkerEnvelope> on0 = rig.Sent(0);
    rig.Sent(1);
    ASSERT_EQ(on0.size(), 1u) << "pool " << pool;
    const uint64_t job = on0[0].infer().job();
    rig.Reply(0, Chunk(job, "Hel", 0, {11}));
    rig.Down(0, {job});
    const v1::WorkerInfer* resumed = nullptr;
    std::vector<int> handles;
    std::vector<std::pair<v1::WorkerEnvelope, std::vector<int>>> sent = rig.SentWithHandles(1);
    for (const auto& [m, h] : sent) {
      if (m.has_infer() && m.infer().resume_tokens_size() > 0) resumed = &m.infer(), handles = h;
    }
    ASSERT_NE(resumed, nullptr) << "pool " << pool;
    if (pool == 50) {
      EXPECT_TRUE(resumed->kv_source());
      EXPECT_EQ(resumed->kv_source_bytes(), pool);
      EXPECT_EQ(handles, std::vector<int>{kCache});
      EXPECT_FALSE(Closed(rig, kCache));
    } else {
      EXPECT_FALSE(resumed->kv_source()) << "no room on the device beside what it holds";
      EXPECT_TRUE(Closed(rig, kCache));
    }
  }
}

}  // namespace
}  // namespace warmpool::supervisor::testing::kv_cache_test
