// ModelIndex over a byte vector: registration, the LRU list, per-device byte accounting, and
// Validate() passing after every legal step (that it catches injected corruption:
// model_index_validate_test.cc).
#include "tests/unit/model_index_fixture.h"

#include <list>
#include <random>
#include <thread>

namespace warmpool::shm {
namespace {

TEST_F(ModelIndexTest, RegisterAndFind) {
  EXPECT_EQ(Reg("alpha", 111), 0u);
  EXPECT_EQ(Reg("beta", 222), 1u);
  EXPECT_EQ(index_.Find("alpha"), 0u);
  EXPECT_EQ(index_.Find("beta"), 1u);
  EXPECT_EQ(index_.Find("gamma"), kNil);
  EXPECT_EQ(index_.Find(""), kNil);
  const ModelRecord& r = index_.Get(1);
  EXPECT_STREQ(r.name, "beta");
  EXPECT_STREQ(r.engine, "dense");
  EXPECT_STREQ(r.path, "/models/beta");
  EXPECT_EQ(r.weight_bytes, 222u);
  EXPECT_EQ(index_.State(1), ModelState::kRegistered);
  EXPECT_EQ(r.worker_slot, kNil);
  EXPECT_EQ(r.in_lru, 0u);
  EXPECT_EQ(r.seq % 2, 0u);
  EXPECT_EQ(index_.All(), (Order{0, 1}));
  EXPECT_EQ(index_.ResidentCount(), 0u);
  ExpectValid();
}

TEST_F(ModelIndexTest, NameEngineAndPathLengthsAreChecked) {
  EXPECT_TRUE(index_.Register(std::string(63, 'n'), "dense", "p", 1).ok());
  Status too_long = index_.Register(std::string(64, 'n'), "dense", "p", 1).status();
  EXPECT_EQ(too_long.code(), Code::kInvalidArgument);
  EXPECT_TRUE(Contains(too_long.message(), "must be 1 to 63 bytes")) << too_long.message();
  EXPECT_EQ(index_.Register("", "dense", "p", 1).status().code(), Code::kInvalidArgument);
  EXPECT_TRUE(index_.Register("e15", std::string(15, 'e'), "p", 1).ok());
  Status engine = index_.Register("e16", std::string(16, 'e'), "p", 1).status();
  EXPECT_EQ(engine.code(), Code::kInvalidArgument);
  EXPECT_TRUE(Contains(engine.message(), "longer than 15 bytes")) << engine.message();
  EXPECT_TRUE(index_.Register("p255", "dense", std::string(255, 'p'), 1).ok());
  Status path = index_.Register("p256", "dense", std::string(256, 'p'), 1).status();
  EXPECT_EQ(path.code(), Code::kInvalidArgument);
  EXPECT_TRUE(Contains(path.message(), "longer than 255 bytes")) << path.message();
  // Refused names take no record.
  EXPECT_EQ(index_.All().size(), 3u);
  EXPECT_EQ(index_.Find("e16"), kNil);
  ExpectValid();
}

TEST_F(ModelIndexTest, FullIndexIsRefused) {
  for (int i = 0; i < 8; i++) Reg("m" + std::to_string(i));
  Status s = index_.Register("one-more", "dense", "p", 1).status();
  EXPECT_EQ(s.code(), Code::kResourceExhausted);
  EXPECT_TRUE(Contains(s.message(), "full (8 models): raise [limits] max_models")) << s.message();
  // Re-registering a known name still works when full.
  EXPECT_TRUE(index_.Register("m3", "echo", "q", 5).ok());
  ExpectValid();
}

TEST_F(ModelIndexTest, ReRegisterUpdatesANonResidentModel) {
  uint32_t a = Reg("a", 100);
  MarkLoading(index_, a, 0, 0, 100);
  MarkNotResident(index_, a, ModelState::kFailed, "bad header");
  EXPECT_EQ(index_.State(a), ModelState::kFailed);
  Result<uint32_t> again = index_.Register("a", "echo", "/elsewhere", 300);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(*again, a);
  const ModelRecord& r = index_.Get(a);
  EXPECT_STREQ(r.engine, "echo");
  EXPECT_STREQ(r.path, "/elsewhere");
  EXPECT_EQ(r.weight_bytes, 300u);
  EXPECT_EQ(index_.State(a), ModelState::kRegistered);
  EXPECT_STREQ(r.last_error, "");
  EXPECT_EQ(r.failures, 1u);  // counters survive
  EXPECT_EQ(r.loads, 1u);
  EXPECT_EQ(index_.All(), (Order{0}));
  ExpectValid();
}

TEST_F(ModelIndexTest, ReRegisterRefusesAResidentModel) {
  uint32_t a = Reg("a", 100);
  MarkLoading(index_, a, 0, 0, 100);
  for (int step = 0; step < 3; step++) {
    Status s = index_.Register("a", "echo", "/x", 999).status();
    EXPECT_EQ(s.code(), Code::kFailedPrecondition) << step;
    EXPECT_TRUE(Contains(s.message(), "model \"a\" is loaded; unload it")) << s.message();
    EXPECT_STREQ(index_.Get(a).engine, "dense");
    EXPECT_EQ(index_.Get(a).weight_bytes, 100u);
    if (step == 0) MarkReady(index_, a, 100, 0);
    if (step == 1) MarkUnloading(index_, a);
  }
  ExpectValid();
}

TEST_F(ModelIndexTest, LruOrderFollowsLoadsTouchesAndUnloads) {
  uint32_t a = Reg("a"), b = Reg("b"), c = Reg("c"), d = Reg("d"), e = Reg("e");
  EXPECT_EQ(index_.LruOrder(), Order{});
  MarkLoading(index_, a, 0, 0, 10);
  MarkLoading(index_, b, 0, 1, 10);
  MarkLoading(index_, c, 1, 2, 10);
  EXPECT_EQ(index_.LruOrder(), (Order{a, b, c}));
  EXPECT_EQ(view_.header().lru_head, a);
  EXPECT_EQ(view_.header().lru_tail, c);
  ExpectValid();
  index_.Touch(a);
  EXPECT_EQ(index_.LruOrder(), (Order{b, c, a}));
  index_.Touch(a);  // already most recent
  EXPECT_EQ(index_.LruOrder(), (Order{b, c, a}));
  MarkReady(index_, b, 10, 0);  // readiness does not count as use
  EXPECT_EQ(index_.LruOrder(), (Order{b, c, a}));
  ExpectValid();
  MarkNotResident(index_, c, ModelState::kRegistered, "");  // middle
  EXPECT_EQ(index_.LruOrder(), (Order{b, a}));
  MarkLoading(index_, d, 0, 3, 10);
  EXPECT_EQ(index_.LruOrder(), (Order{b, a, d}));
  index_.Touch(b);  // head to tail
  EXPECT_EQ(index_.LruOrder(), (Order{a, d, b}));
  index_.Touch(e);  // not resident: ignored
  index_.Touch(c);
  EXPECT_EQ(index_.LruOrder(), (Order{a, d, b}));
  EXPECT_EQ(index_.ResidentCount(), 3u);
  ExpectValid();
  MarkUnloading(index_, d);  // still resident while unloading
  EXPECT_EQ(index_.LruOrder(), (Order{a, d, b}));
  MarkNotResident(index_, b, ModelState::kRegistered, "");  // tail
  EXPECT_EQ(index_.LruOrder(), (Order{a, d}));
  EXPECT_EQ(view_.header().lru_tail, d);
  MarkNotResident(index_, a, ModelState::kRegistered, "");  // head
  EXPECT_EQ(index_.LruOrder(), (Order{d}));
  EXPECT_EQ(view_.header().lru_head, d);
  MarkNotResident(index_, d, ModelState::kRegistered, "");
  EXPECT_EQ(index_.LruOrder(), Order{});
  EXPECT_EQ(view_.header().lru_head, kNil);
  EXPECT_EQ(view_.header().lru_tail, kNil);
  EXPECT_EQ(index_.ResidentCount(), 0u);
  // Not resident any more: a second MarkNotResident changes no link and no account.
  MarkNotResident(index_, d, ModelState::kRegistered, "");
  EXPECT_EQ(index_.ResidentCount(), 0u);
  ExpectValid();
}

TEST_F(ModelIndexTest, ByteAccountingFollowsTheLifecycle) {
  uint32_t a = Reg("a", 100), b = Reg("b", 200);
  MarkLoading(index_, a, 0, 0, 150);  // preflight: 100 weights + 50 workspace
  EXPECT_EQ(index_.DeviceUsed(0), 150u);
  EXPECT_EQ(index_.Get(a).workspace_bytes, 50u);
  EXPECT_EQ(index_.Get(a).loads, 1u);
  ExpectValid();
  MarkReady(index_, a, 120, 40);  // the engine reports what it really allocated
  EXPECT_EQ(index_.DeviceUsed(0), 160u);
  EXPECT_EQ(index_.Get(a).loaded_bytes, 120u);
  ExpectValid();
  MarkLoading(index_, b, 1, 1, 50);  // estimate below the weights: the weights count
  EXPECT_EQ(index_.DeviceUsed(1), 200u);
  EXPECT_EQ(index_.DeviceUsed(0), 160u);
  MarkReady(index_, b, 180, 0);  // correction downwards
  EXPECT_EQ(index_.DeviceUsed(1), 180u);
  ExpectValid();
  MarkUnloading(index_, b);  // bytes stay accounted until the unload is done
  EXPECT_EQ(index_.DeviceUsed(1), 180u);
  ExpectValid();
  MarkNotResident(index_, b, ModelState::kRegistered, "");
  EXPECT_EQ(index_.DeviceUsed(1), 0u);
  EXPECT_EQ(index_.DeviceUsed(0), 160u);
  EXPECT_EQ(index_.Get(b).workspace_bytes, 0u);
  ExpectValid();
  std::string long_error(100, 'x');
  MarkNotResident(index_, a, ModelState::kFailed, long_error);
  EXPECT_EQ(index_.DeviceUsed(0), 0u);
  EXPECT_EQ(index_.State(a), ModelState::kFailed);
  EXPECT_EQ(index_.Get(a).failures, 1u);
  EXPECT_EQ(std::string(index_.Get(a).last_error), std::string(71, 'x'));  // truncated
  ExpectValid();
}

TEST_F(ModelIndexTest, UpdateGoesThroughTheSeqlock) {
  uint32_t a = Reg("a");
  uint32_t before = index_.Get(a).seq;
  index_.Update(a, [](ModelRecord& r) {
    EXPECT_EQ(r.seq % 2, 1u);  // odd while written
    r.pinned = 1;
  });
  EXPECT_EQ(index_.Get(a).seq, before + 2);
  std::optional<ModelRecord> copy = SeqRead(index_.Get(a));
  ASSERT_TRUE(copy.has_value());
  EXPECT_EQ(copy->pinned, 1u);
  view_.model(a).seq++;  // a writer died mid-write
  EXPECT_FALSE(SeqRead(index_.Get(a), 100).has_value());
}

TEST_F(ModelIndexTest, ValidateRunsFromAnotherView) {
  Ready("a", 300);
  Ready("b", 300, 1);
  Result<SegmentView> other = SegmentView::Attach(bytes_, "warmpool.test");
  ASSERT_TRUE(other.ok());
  EXPECT_TRUE(Validate(*other).ok());
  view_.header().device_used_bytes[0] = 1;
  EXPECT_FALSE(Validate(*other).ok());
}

// Random lifecycle operations checked against a std::list reference model of the LRU and a plain
// sum of the accounts, with Validate() after every step.
TEST(ModelIndexRandomTest, MatchesReferenceModel) {
  constexpr uint32_t kModels = 32;
  constexpr Limits limits{kModels, 4, 16};
  std::vector<std::byte> bytes(SegmentSize(limits));
  Result<SegmentView> view = SegmentView::Format(bytes, limits, {0, 0}, 1);
  ASSERT_TRUE(view.ok());
  for (uint32_t w = 0; w < 4; w++) view->worker(w).state = static_cast<uint32_t>(WorkerState::kIdle);
  ModelIndex index(*view);

  std::mt19937 rng(20240611);
  auto pick = [&](uint32_t n) { return static_cast<uint32_t>(rng() % n); };
  struct Ref {
    ModelState state = ModelState::kRegistered;
    uint32_t device = 0;
    uint64_t weight = 0, workspace = 0;
  };
  std::vector<Ref> ref(kModels);
  std::list<uint32_t> lru;
  for (uint32_t m = 0; m < kModels; m++) {
    ref[m].weight = 1 + pick(1000);
    ASSERT_EQ(*index.Register("model-" + std::to_string(m), "dense", "p", ref[m].weight), m);
  }
  auto to_tail = [&](uint32_t m) {
    lru.remove(m);
    lru.push_back(m);
  };

  for (int op = 0; op < 2000; op++) {
    uint32_t m = pick(kModels);
    Ref& r = ref[m];
    uint32_t choice = pick(4);
    if (!IsResident(r.state)) {
      if (choice == 0) {  // re-register with new bytes
        r.weight = 1 + pick(1000);
        ASSERT_TRUE(index.Register("model-" + std::to_string(m), "dense", "q", r.weight).ok());
        r.state = ModelState::kRegistered;
      } else {
        uint64_t estimate = pick(2000);
        r.device = pick(2);
        r.workspace = estimate > r.weight ? estimate - r.weight : 0;
        MarkLoading(index, m, r.device, pick(4), estimate);
        r.state = ModelState::kLoading;
        lru.push_back(m);
      }
    } else if (choice == 0) {
      index.Touch(m);
      to_tail(m);
    } else if (choice == 1 && r.state == ModelState::kLoading) {
      r.weight = 1 + pick(1000);
      r.workspace = pick(100);
      MarkReady(index, m, r.weight, r.workspace);
      r.state = ModelState::kReady;
    } else if (choice == 1 && r.state == ModelState::kReady) {
      MarkUnloading(index, m);
      r.state = ModelState::kUnloading;
    } else if (choice == 2 || r.state == ModelState::kUnloading) {
      ModelState to = pick(2) ? ModelState::kRegistered : ModelState::kFailed;
      MarkNotResident(index, m, to, to == ModelState::kFailed ? "boom" : "");
      r.state = to;
      r.workspace = 0;
      lru.remove(m);
    } else {
      ASSERT_EQ(index.Register("model-" + std::to_string(m), "dense", "q", 1).status().code(),
                Code::kFailedPrecondition);
    }

    ASSERT_EQ(index.LruOrder(), Order(lru.begin(), lru.end())) << "after op " << op;
    ASSERT_EQ(index.ResidentCount(), lru.size()) << "after op " << op;
    uint64_t used[2] = {0, 0};
    for (uint32_t i = 0; i < kModels; i++) {
      ASSERT_EQ(index.State(i), ref[i].state) << "model " << i << " after op " << op;
      if (IsResident(ref[i].state)) used[ref[i].device] += ref[i].weight + ref[i].workspace;
    }
    ASSERT_EQ(index.DeviceUsed(0), used[0]) << "after op " << op;
    ASSERT_EQ(index.DeviceUsed(1), used[1]) << "after op " << op;
    Status s = Validate(*view);
    ASSERT_TRUE(s.ok()) << "after op " << op << ": " << s.ToString();
  }
}

}  // namespace
}  // namespace warmpool::shm

namespace warmpool::shm {
namespace {

// An observer validating while the supervisor is half-way through one event's writes (an account
// moved, the record not yet) waits for the batch to end instead of reporting what is only a torn
// read.
TEST_F(ModelIndexTest, ValidateReadsBetweenTheWritersBatches) {
  uint32_t a = Ready("a", 100);
  index_.BeginChanges();
  view_.header().device_used_bytes[0] += 50;  // the account first, as Publish does ...
  std::thread finisher([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    index_.Update(a, [](ModelRecord& r) { r.workspace_bytes += 50; });  // ... then the record
    index_.EndChanges();
  });
  Status s = Validate(view_);
  finisher.join();
  EXPECT_TRUE(s.ok()) << s.ToString();
  // Outside a batch the same disagreement is reported at once.
  view_.header().device_used_bytes[0] += 1;
  EXPECT_FALSE(Validate(view_).ok());
  view_.header().device_used_bytes[0] -= 1;
}

// Publish derives the accounts and the LRU membership from the state it is given.
TEST_F(ModelIndexTest, PublishMovesBytesBetweenTheAccountsAndTheLruList) {
  uint32_t a = Reg("a", 100);
  ModelIndex::Residency r;
  r.state = ModelState::kLoading;
  r.worker_slot = 1;
  r.replicas = 1;
  r.weight_bytes = 100;
  r.workspace_bytes = 20;
  index_.Publish(a, r);
  EXPECT_EQ(index_.DeviceUsed(0), 120u);
  EXPECT_EQ(index_.LruOrder(), (Order{a}));
  r.state = ModelState::kReady;
  r.workspace_bytes = 40;  // two replicas
  r.replicas = 2;
  index_.Publish(a, r);
  EXPECT_EQ(index_.DeviceUsed(0), 140u);
  EXPECT_TRUE(Validate(view_).ok()) << Validate(view_).ToString();
  index_.SetParkBudget(1000);
  r = ModelIndex::Residency{};
  r.state = ModelState::kParked;
  r.weight_bytes = 100;
  index_.Publish(a, r);
  EXPECT_EQ(index_.DeviceUsed(0), 0u);
  EXPECT_EQ(index_.ParkUsed(), 100u);
  EXPECT_EQ(index_.LruOrder(), (Order{a}));
  r = ModelIndex::Residency{};
  r.state = ModelState::kFailed;
  r.error = "broken";
  index_.Publish(a, r);
  EXPECT_EQ(index_.ParkUsed(), 0u);
  EXPECT_TRUE(index_.LruOrder().empty());
  EXPECT_STREQ(index_.Get(a).last_error, "broken");
  EXPECT_EQ(index_.Get(a).failures, 1u);
  EXPECT_TRUE(Validate(view_).ok()) << Validate(view_).ToString();
}

}  // namespace
}  // namespace warmpool::shm
