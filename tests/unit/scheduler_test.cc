// PlanAdmission and PickWorkerForLoad asked of a ModelIndex laid over a byte vector: no processes,
// no sockets. Sizes are in MiB against a 1 GiB per-device budget.
#include "supervisor/core/scheduler.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "shm/model_index.h"
#include "shm/segment.h"

namespace warmpool::supervisor {
namespace {

using shm::kNil;
using shm::ModelIndex;
using shm::ModelRecord;
using Kind = AdmissionPlan::Kind;
using Victims = std::vector<uint32_t>;

constexpr uint64_t kMiB = 1ull << 20;

bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

class SchedulerTest : public ::testing::Test {
 protected:
  static constexpr shm::Limits kLimits{16, 4, 16};

  explicit SchedulerTest(uint64_t budget = 1024 * kMiB)
      : bytes_(shm::SegmentSize(kLimits)), view_(FormatOrDie(bytes_, budget)), index_(view_) {}

  static shm::SegmentView FormatOrDie(std::vector<std::byte>& bytes, uint64_t budget) {
    Result<shm::SegmentView> v = shm::SegmentView::Format(bytes, kLimits, 2, budget, 1);
    if (!v.ok()) {
      ADD_FAILURE() << v.status().ToString();
      return shm::SegmentView();
    }
    for (uint32_t w = 0; w < kLimits.max_workers; w++) {
      v->worker(w).state = static_cast<uint32_t>(shm::WorkerState::kIdle);
    }
    return *v;
  }
  void TearDown() override {
    Status s = shm::Validate(view_);  // every scenario is a legal index state
    EXPECT_TRUE(s.ok()) << s.ToString();
  }

  uint32_t Registered(const std::string& name, uint64_t mib = 100) {
    Result<uint32_t> r = index_.Register(name, "dense", "/m/" + name, mib * kMiB);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : kNil;
  }
  uint32_t Loading(const std::string& name, uint64_t mib, uint32_t device = 0) {
    uint32_t i = Registered(name, mib);
    index_.MarkLoading(i, device, device, mib * kMiB);
    return i;
  }
  uint32_t Ready(const std::string& name, uint64_t mib, uint32_t device = 0) {
    uint32_t i = Loading(name, mib, device);
    index_.MarkReady(i, mib * kMiB, 0);
    return i;
  }
  uint32_t Unloading(const std::string& name, uint64_t mib, uint32_t device = 0) {
    uint32_t i = Ready(name, mib, device);
    index_.MarkUnloading(i);
    return i;
  }
  void SetInflight(uint32_t i, uint32_t n) {
    index_.Update(i, [&](ModelRecord& r) { r.inflight = n; });
  }
  void Pin(uint32_t i) {
    index_.Update(i, [](ModelRecord& r) { r.pinned = 1; });
  }
  AdmissionPlan Plan(uint32_t model, uint64_t mib, uint32_t capacity = 0, uint32_t device = 0) {
    return PlanAdmission(index_, model, device, mib * kMiB, PoolLimits{capacity});
  }

  std::vector<std::byte> bytes_;
  shm::SegmentView view_;
  ModelIndex index_;
};

TEST_F(SchedulerTest, AdmitsWhenItFits) {
  Ready("a", 300);
  uint32_t x = Registered("x", 500);
  AdmissionPlan plan = Plan(x, 500);
  EXPECT_EQ(plan.kind, Kind::kAdmit);
  EXPECT_TRUE(plan.victims.empty());
  EXPECT_TRUE(plan.reason.ok());
  EXPECT_EQ(Plan(x, 724).kind, Kind::kAdmit);  // 300 + 724 = the budget exactly
  EXPECT_EQ(Plan(x, 725).kind, Kind::kEvict);
}

TEST_F(SchedulerTest, RejectsAModelBiggerThanTheBudget) {
  uint32_t x = Registered("x", 1536);
  AdmissionPlan plan = Plan(x, 1536);
  EXPECT_EQ(plan.kind, Kind::kReject);
  EXPECT_TRUE(plan.victims.empty());
  EXPECT_EQ(plan.reason.code(), Code::kResourceExhausted);
  EXPECT_TRUE(Contains(plan.reason.message(),
                       "model \"x\" needs 1.5 GiB but the device budget is 1.0 GiB"))
      << plan.reason.message();
  EXPECT_TRUE(Contains(plan.reason.message(), "raise --budget or [pool] budget"));
}

TEST_F(SchedulerTest, EvictsLeastRecentlyUsedFirstAndJustEnough) {
  uint32_t a = Ready("a", 300), b = Ready("b", 300), c = Ready("c", 300);
  uint32_t x = Registered("x");
  AdmissionPlan one = Plan(x, 400);  // 900 + 400 > 1024; without a: 1000
  EXPECT_EQ(one.kind, Kind::kEvict);
  EXPECT_EQ(one.victims, (Victims{a}));
  AdmissionPlan two = Plan(x, 600);
  EXPECT_EQ(two.kind, Kind::kEvict);
  EXPECT_EQ(two.victims, (Victims{a, b}));
  index_.Touch(a);  // now b, c, a
  EXPECT_EQ(Plan(x, 600).victims, (Victims{b, c}));
  EXPECT_EQ(Plan(x, 1000).victims, (Victims{b, c, a}));
}

TEST_F(SchedulerTest, NeverEvictsTheModelBeingAdmitted) {
  uint32_t a = Ready("a", 300), b = Ready("b", 300), c = Ready("c", 300);
  AdmissionPlan plan = Plan(a, 600);  // a is least recently used, yet it is the one asked for
  EXPECT_EQ(plan.kind, Kind::kEvict);
  EXPECT_EQ(plan.victims, (Victims{b, c}));
}

TEST_F(SchedulerTest, WaitsWhenOnlyBusyOrLoadingModelsAreInTheWay) {
  uint32_t a = Ready("a", 600);
  SetInflight(a, 1);
  Loading("b", 300);
  uint32_t x = Registered("x");
  AdmissionPlan plan = Plan(x, 400);
  EXPECT_EQ(plan.kind, Kind::kWait);
  EXPECT_TRUE(plan.victims.empty());
  EXPECT_TRUE(plan.reason.ok());
}

TEST_F(SchedulerTest, SkipsBusyModelsAndEvictsIdleOnesBehindThem) {
  uint32_t a = Ready("a", 300);  // least recently used, but busy
  SetInflight(a, 2);
  uint32_t b = Ready("b", 300), c = Ready("c", 300);
  uint32_t x = Registered("x");
  AdmissionPlan plan = Plan(x, 400);
  EXPECT_EQ(plan.kind, Kind::kEvict);
  EXPECT_EQ(plan.victims, (Victims{b}));
  (void)c;
}

TEST_F(SchedulerTest, EvictsWhatItCanWhenBusyModelsMustStillFinish) {
  uint32_t a = Ready("a", 500);
  SetInflight(a, 1);
  uint32_t b = Ready("b", 300);
  uint32_t x = Registered("x");
  AdmissionPlan plan = Plan(x, 600);  // even without b: 500 + 600 > 1024
  EXPECT_EQ(plan.kind, Kind::kEvict);
  EXPECT_EQ(plan.victims, (Victims{b}));
}

TEST_F(SchedulerTest, CapacityForcesEvictionWithBytesFree) {
  uint32_t a = Ready("a", 100), b = Ready("b", 100);
  uint32_t x = Registered("x");
  EXPECT_EQ(Plan(x, 100, /*capacity=*/3).kind, Kind::kAdmit);
  AdmissionPlan plan = Plan(x, 100, /*capacity=*/2);
  EXPECT_EQ(plan.kind, Kind::kEvict);
  EXPECT_EQ(plan.victims, (Victims{a}));
  EXPECT_EQ(Plan(x, 100, /*capacity=*/1).victims, (Victims{a, b}));
  SetInflight(a, 1);
  EXPECT_EQ(Plan(x, 100, /*capacity=*/2).victims, (Victims{b}));
}

TEST_F(SchedulerTest, CapacityCountsOnlyTheTargetDevice) {
  Ready("a", 100, /*device=*/1);
  uint32_t x = Registered("x");
  AdmissionPlan plan = Plan(x, 100, /*capacity=*/1, /*device=*/0);
  EXPECT_EQ(plan.kind, Kind::kAdmit) << plan.reason.ToString();
  uint32_t b = Ready("b", 100, /*device=*/0);
  plan = Plan(x, 100, /*capacity=*/1, /*device=*/0);
  EXPECT_EQ(plan.kind, Kind::kEvict);
  EXPECT_EQ(plan.victims, (Victims{b}));
}

TEST_F(SchedulerTest, VictimsComeOnlyFromTheTargetDevice) {
  uint32_t a = Ready("a", 600, /*device=*/0);
  uint32_t b = Ready("b", 600, /*device=*/1);
  uint32_t x = Registered("x");
  EXPECT_EQ(Plan(x, 500, 0, /*device=*/0).victims, (Victims{a}));
  EXPECT_EQ(Plan(x, 500, 0, /*device=*/1).victims, (Victims{b}));
  EXPECT_EQ(Plan(x, 400, 0, /*device=*/1).kind, Kind::kAdmit);
}

TEST_F(SchedulerTest, UnloadingBytesCountAsComingBack) {
  Unloading("a", 500);
  Ready("b", 300);
  uint32_t x = Registered("x");
  AdmissionPlan plan = Plan(x, 500);  // 800 + 500 > 1024, but 300 + 500 fits once a is gone
  EXPECT_EQ(plan.kind, Kind::kWait);
  EXPECT_TRUE(plan.victims.empty());
}

TEST_F(SchedulerTest, UnloadingBytesReduceTheVictimsNeeded) {
  Unloading("a", 300);
  uint32_t b = Ready("b", 300);
  Ready("c", 300);
  uint32_t x = Registered("x");
  AdmissionPlan plan = Plan(x, 600);  // 900 - 300 unloading = 600; + 600 needs b gone too
  EXPECT_EQ(plan.kind, Kind::kEvict);
  EXPECT_EQ(plan.victims, (Victims{b}));
}

TEST_F(SchedulerTest, UnloadingModelsFreeCapacityToo) {
  Unloading("a", 100);
  Ready("b", 100);
  uint32_t x = Registered("x");
  AdmissionPlan plan = Plan(x, 100, /*capacity=*/2);
  EXPECT_EQ(plan.kind, Kind::kWait);
  EXPECT_TRUE(plan.victims.empty());
}

TEST_F(SchedulerTest, RejectsNamingPinnedModelsWhenEverythingIsPinned) {
  uint32_t a = Ready("alpha", 500), b = Ready("beta", 500);
  Pin(a);
  Pin(b);
  uint32_t x = Registered("x");
  AdmissionPlan plan = Plan(x, 500);
  EXPECT_EQ(plan.kind, Kind::kReject);
  EXPECT_TRUE(plan.victims.empty());
  EXPECT_EQ(plan.reason.code(), Code::kResourceExhausted);
  EXPECT_TRUE(Contains(plan.reason.message(), "no room for model \"x\" (500.0 MiB)"))
      << plan.reason.message();
  EXPECT_TRUE(Contains(plan.reason.message(), "1000.0 MiB of 1.0 GiB in use, pinned: alpha, beta"))
      << plan.reason.message();
  EXPECT_TRUE(Contains(plan.reason.message(), "unpin or unload a model"));
}

TEST_F(SchedulerTest, PinnedModelsAreSkippedNotEvicted) {
  uint32_t a = Ready("a", 400);
  Pin(a);
  uint32_t b = Ready("b", 400);
  uint32_t x = Registered("x");
  AdmissionPlan plan = Plan(x, 400);
  EXPECT_EQ(plan.kind, Kind::kEvict);
  EXPECT_EQ(plan.victims, (Victims{b}));
}

TEST_F(SchedulerTest, PinnedAndBusyMeansWait) {
  uint32_t a = Ready("a", 500), b = Ready("b", 500);
  Pin(a);
  SetInflight(b, 1);
  uint32_t x = Registered("x");
  AdmissionPlan plan = Plan(x, 500);
  EXPECT_EQ(plan.kind, Kind::kWait);
  EXPECT_TRUE(plan.victims.empty());
}

class UnlimitedBudgetTest : public SchedulerTest {
 protected:
  UnlimitedBudgetTest() : SchedulerTest(/*budget=*/0) {}
};

TEST_F(UnlimitedBudgetTest, OnlyCapacityLimits) {
  uint32_t a = Ready("a", 100000);
  uint32_t x = Registered("x");
  EXPECT_EQ(Plan(x, 1ull << 30).kind, Kind::kAdmit);
  AdmissionPlan plan = Plan(x, 1, /*capacity=*/1);
  EXPECT_EQ(plan.kind, Kind::kEvict);
  EXPECT_EQ(plan.victims, (Victims{a}));
}

TEST(PickWorkerForLoadTest, FewestModelsThenFewestOutstanding) {
  EXPECT_EQ(PickWorkerForLoad({{0, true, 2, 0}, {1, true, 1, 5}, {2, true, 1, 3}}), 2u);
  EXPECT_EQ(PickWorkerForLoad({{0, true, 0, 9}, {1, true, 1, 0}}), 0u);
  EXPECT_EQ(PickWorkerForLoad({{5, true, 3, 3}}), 5u);
}

TEST(PickWorkerForLoadTest, TiesGoToTheFirstListed) {
  EXPECT_EQ(PickWorkerForLoad({{3, true, 1, 0}, {1, true, 1, 0}}), 3u);
}

TEST(PickWorkerForLoadTest, SkipsDeadWorkers) {
  EXPECT_EQ(PickWorkerForLoad({{0, false, 0, 0}, {1, true, 4, 4}, {2, false, 0, 0}}), 1u);
}

TEST(PickWorkerForLoadTest, NoLiveWorkerIsNil) {
  EXPECT_EQ(PickWorkerForLoad({}), kNil);
  EXPECT_EQ(PickWorkerForLoad({{0, false, 0, 0}, {1, false, 0, 0}}), kNil);
}

}  // namespace
}  // namespace warmpool::supervisor
