// Weights kept across a restart of the supervisor (supervisor/core/adoption.cc): what one core says
// is worth keeping, and what the next one adopts, refuses or lets go under its own budgets.
#include <algorithm>

#include "tests/unit/core_rig.h"

namespace warmpool::supervisor::testing {
namespace {

Config WithPark(uint64_t park_budget = 1000) {
  Config c = CoreRig::SmallConfig();  // budget 1000
  c.park_budget_bytes = park_budget;
  return c;
}

// a ready on worker 0 (handle 100), b parked (its copy: handle 201), a used last.
std::vector<KeptWeights> KeptFromARunningCore(const ModelEntry& a, const ModelEntry& b) {
  CoreRig rig(WithPark());
  rig.Start({a, b});
  rig.Up(0);
  rig.Up(1);
  rig.Loaded(0, b, 101);
  rig.Forget();
  rig.Unload(1, "b", /*park=*/true);
  std::vector<v1::WorkerEnvelope> to0 = rig.Sent(0);
  EXPECT_EQ(to0.size(), 2u);
  if (to0.size() != 2u) return {};
  rig.Reply(0, CoreRig::ParkDone(to0[0].park().job(), b.weight_bytes), {201});
  rig.Reply(0, CoreRig::UnloadDone(to0[1].unload().job()));
  EXPECT_EQ(rig.State("b"), shm::ModelState::kParked);
  rig.Forget();
  rig.Load(1, "a");
  std::vector<v1::WorkerEnvelope> loads = rig.Sent(0), to1 = rig.Sent(1);
  const uint32_t slot = loads.empty() ? 1 : 0;
  if (loads.empty()) loads = to1;
  EXPECT_EQ(loads.size(), 1u);
  if (loads.size() != 1u) return {};
  rig.Reply(slot, CoreRig::LoadDone(loads[0].load().job(), a), {100});
  return rig.core().Kept();
}

TEST(CoreAdoptionTest, ARunningCoreKeepsItsWeightsAndParkedCopiesLeastRecentlyUsedFirst) {
  ModelEntry a = Entry("a", 300, 50), b = Entry("b", 200, 50);
  std::vector<KeptWeights> kept = KeptFromARunningCore(a, b);
  ASSERT_EQ(kept.size(), 2u);
  EXPECT_EQ(kept[0].name, "b");
  EXPECT_TRUE(kept[0].parked);
  EXPECT_EQ(kept[0].weights.handle, 201);
  EXPECT_EQ(kept[0].weights.weight_bytes, 200u);
  EXPECT_EQ(kept[1].name, "a");
  EXPECT_FALSE(kept[1].parked);
  EXPECT_EQ(kept[1].weights.handle, 100);
  EXPECT_EQ(kept[1].weights.header, a.header);
  EXPECT_EQ(kept[1].weights.version, a.version);
}

TEST(CoreAdoptionTest, TheNextCoreAdoptsThemAndTheFirstRequestAttachesWithoutAFileRead) {
  ModelEntry a = Entry("a", 300, 50), b = Entry("b", 200, 50);
  std::vector<KeptWeights> kept = KeptFromARunningCore(a, b);
  ASSERT_EQ(kept.size(), 2u);
  CoreRig rig(WithPark());
  rig.Start({a, b}, kept);
  EXPECT_EQ(rig.core().adopted(), 2u);
  EXPECT_TRUE(rig.Closed().empty());
  EXPECT_EQ(rig.State("a"), shm::ModelState::kReady) << "ready at once, before any worker is up";
  EXPECT_EQ(rig.State("b"), shm::ModelState::kParked);
  EXPECT_EQ(rig.Used(), 350u) << "a's weights and the one workspace a detached model reserves";
  EXPECT_EQ(rig.index().ParkUsed(), 200u);
  // The LRU order is the one kept: b least recently used.
  std::vector<uint32_t> lru = rig.index().LruOrder();
  ASSERT_EQ(lru.size(), 2u);
  EXPECT_EQ(lru[0], rig.index().Find("b"));
  EXPECT_EQ(lru[1], rig.index().Find("a"));
  rig.Up(0);
  rig.Up(1);
  rig.Forget();
  rig.Infer(7, "a");
  std::vector<std::pair<v1::WorkerEnvelope, std::vector<int>>> sent = rig.SentWithHandles(0);
  std::vector<std::pair<v1::WorkerEnvelope, std::vector<int>>> to1 = rig.SentWithHandles(1);
  const uint32_t slot = sent.empty() ? 1 : 0;
  if (sent.empty()) sent = to1;
  ASSERT_GE(sent.size(), 1u);
  ASSERT_TRUE(sent[0].first.has_attach()) << "an attach of the kept weights, not a load";
  EXPECT_FALSE(sent[0].first.attach().copy());
  EXPECT_EQ(sent[0].second, (std::vector<int>{100}));
  rig.Reply(slot, CoreRig::LoadDone(sent[0].first.attach().job(), a, /*shared=*/false));
  std::vector<v1::WorkerEnvelope> infer = rig.Sent(slot);
  ASSERT_EQ(infer.size(), 1u);
  ASSERT_TRUE(infer[0].has_infer());
  rig.Reply(slot, CoreRig::InferDone(infer[0].infer().job()));
  std::vector<v1::Envelope> replies = rig.Replies(7);
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_TRUE(replies[0].has_infer_reply()) << replies[0].DebugString();
  // b unparks from its kept copy.
  rig.Forget();
  rig.Load(1, "b");
  std::vector<action::SendToWorker> unpark = rig.SendsTo(0), unpark1 = rig.SendsTo(1);
  unpark.insert(unpark.end(), unpark1.begin(), unpark1.end());
  ASSERT_EQ(unpark.size(), 1u);
  EXPECT_EQ(unpark[0].handles, (std::vector<int>{201}));
}

TEST(CoreAdoptionTest, WeightsThatNoLongerMatchTheRegistryAreClosedAndLogged) {
  ModelEntry a = Entry("a", 300, 50), b = Entry("b", 200, 50);
  std::vector<KeptWeights> kept = KeptFromARunningCore(a, b);
  ASSERT_EQ(kept.size(), 2u);
  struct Case {
    const char* what;
    std::vector<ModelEntry> registry;
    const char* log;
  };
  ModelEntry a2 = Entry("a", 300, 50, /*version=*/2);  // rewritten since
  ModelEntry a_touched = a;
  a_touched.version.mtime_ns++;  // same header, another modification time
  ModelEntry a_rewritten = a;
  a_rewritten.version.ctime_ns++;  // written in place, its modification time put back (cp -p)
  ModelEntry a_engine = a;
  a_engine.engine = "echo";
  ModelEntry a_broken = a;
  a_broken.problem = Error(Code::kInvalidArgument, "garbage header");
  for (const Case& c : {Case{"a new version", {a2, b}, "its file changed since it was loaded"},
                        Case{"another mtime", {a_touched, b}, "its file changed since it was loaded"},
                        Case{"another ctime", {a_rewritten, b}, "its file changed since it was loaded"},
                        Case{"another engine", {a_engine, b}, "registered as engine \"echo\""},
                        Case{"a broken file", {a_broken, b}, "registered as failed: garbage header"},
                        Case{"gone from the registry", {b}, "not in the registry any more"}}) {
    CoreRig rig(WithPark());
    rig.Start(c.registry, kept);
    EXPECT_EQ(rig.Closed(), (std::vector<int>{100})) << c.what;
    EXPECT_NE(rig.Logs().find(c.log), std::string::npos) << c.what << ":\n" << rig.Logs();
    EXPECT_EQ(rig.State("b"), shm::ModelState::kParked) << c.what << ": the other model is adopted";
    EXPECT_EQ(rig.core().adopted(), 1u) << c.what;
    if (rig.index().Find("a") != shm::kNil) {
      EXPECT_NE(rig.State("a"), shm::ModelState::kReady) << c.what;
    }
  }
}

TEST(CoreAdoptionTest, AFileDeletedSinceStillServesTheWeightsKept) {
  ModelEntry a = Entry("a", 300, 50), b = Entry("b", 200, 50);
  std::vector<KeptWeights> kept = KeptFromARunningCore(a, b);
  ModelEntry gone = a;
  gone.problem = Error(Code::kNotFound, "no such file");
  gone.file_missing = true;
  gone.path_refused = true;
  gone.path = "/models/current.safetensors";  // as configured: a symlink to the file, say
  gone.header.clear();
  gone.version = {};
  CoreRig rig(WithPark());
  rig.Start({gone, b}, kept);
  EXPECT_TRUE(rig.Closed().empty());
  EXPECT_EQ(rig.State("a"), shm::ModelState::kReady);
  EXPECT_NE(rig.Logs().find("is gone; serving the weights kept"), std::string::npos) << rig.Logs();
  // Its path is refused now (nothing to resolve), which stops loads from the file, not an attach of
  // the weights held.
  rig.Up(0);
  rig.Up(1);
  rig.Forget();
  rig.Infer(3, "a");
  std::vector<v1::WorkerEnvelope> sent = rig.Sent(0), to1 = rig.Sent(1);
  sent.insert(sent.end(), to1.begin(), to1.end());
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_TRUE(sent[0].has_attach());
  EXPECT_TRUE(rig.Replies(3).empty()) << "not refused";
}

// What a core adopted of a deleted file it keeps again with the version the weights were read
// from (the registry has none for a missing file): a third supervisor adopts them as the second did.
TEST(CoreAdoptionTest, WeightsOfADeletedFileAreKeptAgainWithTheVersionTheyWereReadFrom) {
  ModelEntry a = Entry("a", 300, 50), b = Entry("b", 200, 50);
  std::vector<KeptWeights> kept = KeptFromARunningCore(a, b);
  ModelEntry gone = a;
  gone.problem = Error(Code::kNotFound, "no such file");
  gone.file_missing = true;
  gone.path_refused = true;
  gone.header.clear();
  gone.version = {};
  for (int restart = 1; restart <= 2; restart++) {
    SCOPED_TRACE(restart);
    CoreRig rig(WithPark());
    rig.Start({gone, b}, kept);
    EXPECT_TRUE(rig.Closed().empty()) << rig.Logs();
    EXPECT_EQ(rig.State("a"), shm::ModelState::kReady);
    kept = rig.core().Kept();
    ASSERT_EQ(kept.size(), 2u);
    EXPECT_EQ(kept[1].name, "a");
    EXPECT_EQ(kept[1].weights.version, a.version) << "what the weights were read from, not the registry's nothing";
  }
}

TEST(CoreAdoptionTest, TheSameModelKeptTwiceIsAdoptedOnce) {
  ModelEntry a = Entry("a", 300, 50), b = Entry("b", 200, 50);
  std::vector<KeptWeights> kept = KeptFromARunningCore(a, b);
  kept.push_back(kept[1]);
  kept.back().weights.handle = 300;
  CoreRig rig(WithPark());
  rig.Start({a, b}, kept);
  EXPECT_EQ(rig.Closed(), (std::vector<int>{300}));
  EXPECT_EQ(rig.core().adopted(), 2u);
}

TEST(CoreAdoptionTest, ASmallerBudgetKeepsTheMostRecentOnTheDeviceAndParksOrDropsTheRest) {
  ModelEntry a = Entry("a", 300, 50), b = Entry("b", 200, 50);
  std::vector<KeptWeights> kept = KeptFromARunningCore(a, b);
  kept[0].parked = false;  // b on the device too, used before a
  kept[0].weights.device = 0;
  for (uint64_t park : {uint64_t{1000}, uint64_t{0}}) {
    Config c = WithPark(park);
    c.budget_bytes = 400;  // room for one of them
    CoreRig rig(c);
    rig.Start({a, b}, kept);
    EXPECT_EQ(rig.State("a"), shm::ModelState::kReady) << "the most recently used stays on the device";
    if (park != 0) {
      EXPECT_EQ(rig.State("b"), shm::ModelState::kParked) << "host memory: the region becomes the copy";
      EXPECT_TRUE(rig.Closed().empty());
    } else {
      EXPECT_EQ(rig.State("b"), shm::ModelState::kRegistered) << "no park budget: dropped";
      EXPECT_EQ(rig.Closed(), (std::vector<int>{201}));
    }
    EXPECT_LE(rig.Used(), 400u);
  }
}

TEST(CoreAdoptionTest, CapacityAndMaxCachedAreHonoured) {
  ModelEntry a = Entry("a", 300, 50), b = Entry("b", 200, 50);
  std::vector<KeptWeights> kept = KeptFromARunningCore(a, b);
  kept[0].parked = false;
  {
    Config c = WithPark(0);
    c.capacity = 1;
    CoreRig rig(c);
    rig.Start({a, b}, kept);
    EXPECT_EQ(rig.State("a"), shm::ModelState::kReady);
    EXPECT_EQ(rig.State("b"), shm::ModelState::kRegistered);
  }
  {
    Config c = WithPark(1000);
    c.max_cached = 1;
    CoreRig rig(c);
    rig.Start({a, b}, kept);
    EXPECT_EQ(rig.State("a"), shm::ModelState::kReady);
    EXPECT_EQ(rig.State("b"), shm::ModelState::kRegistered) << "parking would still cache it";
  }
}

TEST(CoreAdoptionTest, OnCudaOnlyParkedCopiesAreKeptAndAdopted) {
  ModelEntry a = Entry("a", 300, 50), b = Entry("b", 200, 50);
  std::vector<KeptWeights> kept = KeptFromARunningCore(a, b);
  Config c = WithPark();
  c.backend = Backend::kCuda;
  CoreRig rig(c);
  rig.Start({a, b}, kept);
  EXPECT_EQ(rig.Closed(), (std::vector<int>{100})) << "device memory of a dead owner process";
  EXPECT_EQ(rig.State("b"), shm::ModelState::kParked);
  // And a cuda core keeps only its parked copies.
  std::vector<KeptWeights> again = rig.core().Kept();
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].name, "b");
}

TEST(CoreAdoptionTest, OnCudaDeviceWeightsAreKeptOnlyWhenAskedForAndSharedByDescriptor) {
  ModelEntry a = Entry("a", 300, 50), b = Entry("b", 200, 50);
  std::vector<KeptWeights> kept = KeptFromARunningCore(a, b);
  for (const char* sharing : {"vmm", "legacy"}) {
    Config c = WithPark();
    c.backend = Backend::kCuda;
    c.cuda_keep_across_restarts = true;
    c.cuda_sharing = sharing;
    CoreRig rig(c);
    rig.Start({a, b}, kept);
    const bool vmm = std::string(sharing) == "vmm";
    EXPECT_EQ(rig.State("a"), vmm ? shm::ModelState::kReady : shm::ModelState::kRegistered) << sharing;
    EXPECT_EQ(rig.core().Kept().size(), vmm ? 2u : 1u) << sharing;
  }
  // Device memory that no longer fits is dropped: no worker is there to copy it out.
  Config c = WithPark();
  c.backend = Backend::kCuda;
  c.cuda_keep_across_restarts = true;
  c.cuda_sharing = "vmm";
  c.budget_bytes = 200;
  CoreRig rig(c);
  rig.Start({a, b}, kept);
  EXPECT_EQ(rig.State("a"), shm::ModelState::kRegistered);
  EXPECT_EQ(rig.Closed(), (std::vector<int>{100}));
}

// A language model's engine reported fewer bytes a position than registration counted (a bf16 KV
// cache): the next core adopts its counts and its bytes together, as a load report sets them.
TEST(CoreAdoptionTest, AnAdoptedLanguageModelKeepsTheBytesAPositionItsEngineReported) {
  ModelEntry lm = LanguageModel("lm");  // 8 bytes a position, as registered
  lm.sequences = 1;
  lm.workspace_bytes = 10 + 64 * 8;
  std::vector<KeptWeights> kept;
  {
    CoreRig rig(WithPark());
    rig.Start({lm});
    rig.Up(0);
    rig.Load(1, "lm");
    std::vector<v1::WorkerEnvelope> sent = rig.Sent(0);
    ASSERT_EQ(sent.size(), 1u);
    ModelEntry reported = lm;
    reported.kv_bytes_per_token = 4;
    reported.workspace_bytes = 10 + 64 * 4;
    rig.Reply(0, CoreRig::LoadDone(sent[0].load().job(), reported), {100});
    kept = rig.core().Kept();
  }
  ASSERT_EQ(kept.size(), 1u);
  CoreRig rig(WithPark());
  rig.Start({lm}, kept);
  ASSERT_EQ(rig.core().adopted(), 1u);
  v1::Envelope models;
  models.mutable_models();
  rig.Request(9, std::move(models));
  std::vector<v1::Envelope> replies = rig.Replies(9);
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_EQ(replies[0].models_reply().models(0).kv_bytes_per_token(), 4u);
}

TEST(CoreAdoptionTest, ALoadThatCorrectsWhatTheModelNeedsKeepsItsFileVersion) {
  // A cuda worker reports a larger workspace than the registry estimated: the same file (header),
  // admitted again for what it needs, and still the version a restart may adopt.
  ModelEntry a = Entry("a", 300, 50);
  CoreRig rig(WithPark());
  rig.Start({a});
  rig.Up(0);
  rig.Load(1, "a");
  std::vector<v1::WorkerEnvelope> sent = rig.Sent(0);
  ASSERT_EQ(sent.size(), 1u);
  ModelEntry bigger = a;
  bigger.workspace_bytes = 80;
  v1::WorkerEnvelope done = CoreRig::LoadDone(sent[0].load().job(), bigger);
  done.mutable_load_done()->set_file_changed(true);
  rig.Reply(0, done);
  sent = rig.Sent(0);
  ASSERT_EQ(sent.size(), 1u);
  ASSERT_TRUE(sent[0].has_load()) << "admitted again";
  rig.Reply(0, CoreRig::LoadDone(sent[0].load().job(), bigger), {100});
  std::vector<KeptWeights> kept = rig.core().Kept();
  ASSERT_EQ(kept.size(), 1u);
  EXPECT_EQ(kept[0].weights.version, a.version);
}


namespace store_cadence {

std::vector<std::string> Names(const action::StoreKept& store) {
  std::vector<std::string> names;
  for (const KeptWeights& k : store.kept) names.push_back(k.name);
  return names;
}

// The core decides when the service manager's store is written (kept.h): the shell and the
// simulator only carry action::StoreKept out.
TEST(CoreStoreCadenceTest, AStartStoresOnceAndANewModelWithinTheSyncPeriod) {
  ModelEntry a = Entry("a", 300, 50), b = Entry("b", 200, 50);
  CoreRig rig(WithPark());
  rig.Start({a, b});
  // Even with nothing kept: the store lets go of what the start was given and did not adopt.
  ASSERT_EQ(rig.Count<action::StoreKept>(), 1u);
  EXPECT_TRUE(rig.Of<action::StoreKept>()[0].kept.empty());
  rig.Up(0);
  rig.Up(1);
  rig.Forget();
  rig.Loaded(0, a, 100);
  EXPECT_EQ(rig.Count<action::StoreKept>(), 0u) << "within kKeptSyncMs of the last look";
  rig.Advance(kKeptSyncMs);
  ASSERT_EQ(rig.Count<action::StoreKept>(), 1u);
  EXPECT_EQ(Names(rig.Of<action::StoreKept>()[0]), std::vector<std::string>{"a"});
  rig.Forget();
  rig.Advance(10 * kKeptSyncMs);
  EXPECT_EQ(rig.Count<action::StoreKept>(), 0u) << "nothing changed";
}

TEST(CoreStoreCadenceTest, AnOrderThatMovedWaitsForTheOrderPeriodOrTheStop) {
  ModelEntry a = Entry("a", 300, 50), b = Entry("b", 200, 50);
  CoreRig rig(WithPark());
  rig.Start({a, b});
  rig.Up(0);
  rig.Up(1);
  rig.Forget();
  rig.Loaded(0, a, 100);
  rig.Loaded(1, b, 101);
  rig.Advance(kKeptSyncMs);
  ASSERT_EQ(rig.Count<action::StoreKept>(), 1u);
  EXPECT_EQ(Names(rig.Of<action::StoreKept>().back()), (std::vector<std::string>{"a", "b"}));
  rig.Forget();

  // A request for a moves it to the most recently used end: the same models, another order.
  rig.Infer(2, "a");
  rig.Advance(kKeptSyncMs);
  EXPECT_EQ(rig.Count<action::StoreKept>(), 0u) << "only the order moved";
  rig.Advance(kKeptOrderOnlyMs);
  ASSERT_EQ(rig.Count<action::StoreKept>(), 1u);
  EXPECT_EQ(Names(rig.Of<action::StoreKept>()[0]), (std::vector<std::string>{"b", "a"}));
  rig.Forget();

  // Moved again, and a stop comes before the period is over: the order as it is at the end.
  rig.Infer(2, "b");
  rig.Advance(kKeptSyncMs);
  EXPECT_EQ(rig.Count<action::StoreKept>(), 0u);
  rig.Handle(event::WorkersStopped{});
  ASSERT_EQ(rig.Count<action::StoreKept>(), 1u);
  EXPECT_EQ(Names(rig.Of<action::StoreKept>()[0]), (std::vector<std::string>{"a", "b"}));
}

}  // namespace store_cadence

}  // namespace
}  // namespace warmpool::supervisor::testing
