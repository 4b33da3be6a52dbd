// The policies as tables: a pool described as plain values (policy::Resident, WorkerView), the
// decision asked, and checked. No core, no segment, no process. Sizes are in MiB against a 1 GiB
// device budget. (Retries, workers and device owners: policy_workers_test.cc.)
#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "supervisor/policy/admission.h"
#include "supervisor/policy/placement.h"
#include "tests/text.h"

namespace warmpool::supervisor::policy {
namespace {

using Kind = AdmissionPlan::Kind;
using Where = Resident::Where;
using Victims = std::vector<uint32_t>;

constexpr uint64_t kMiB = 1ull << 20;

using ::warmpool::testing::Contains;

// A pool in LRU order (least recently used first): each Add puts a model at the MRU end.
class Pool {
 public:
  uint32_t Add(const std::string& name, uint64_t mib, Where where = Where::kDevice,
               uint32_t device = 0) {
    Resident r;
    r.model = static_cast<uint32_t>(lru_.size() + 100);
    r.name = name;
    r.where = where;
    r.device = device;
    if (where == Where::kParked) r.parked_bytes = mib * kMiB;
    else r.device_bytes = mib * kMiB;
    lru_.push_back(r);
    return r.model;
  }
  Resident& Get(uint32_t model) {
    for (Resident& r : lru_) {
      if (r.model == model) return r;
    }
    static Resident none;
    return none;
  }
  void Touch(uint32_t model) {
    Resident r = Get(model);
    std::erase_if(lru_, [&](const Resident& x) { return x.model == model; });
    lru_.push_back(r);
  }
  uint64_t Used() const {
    uint64_t used = 0;
    for (const Resident& r : lru_) used += r.device_bytes;
    return used;
  }
  AdmissionPlan Plan(uint32_t model, uint64_t mib, uint32_t capacity = 0, uint64_t budget_mib = 1024) {
    Limits limits{budget_mib * kMiB, capacity, 0, 0};
    return PlanAdmission(lru_, model, model == kNew ? "x" : Get(model).name, mib * kMiB, Used(), limits);
  }
  const std::vector<Resident>& lru() const { return lru_; }
  static constexpr uint32_t kNew = 1;  // a model not cached yet

 private:
  std::vector<Resident> lru_;
};

constexpr uint32_t x = Pool::kNew;

TEST(AdmissionTest, AdmitsWhenItFits) {
  Pool pool;
  pool.Add("a", 300);
  EXPECT_EQ(pool.Plan(x, 500).kind, Kind::kAdmit);
  EXPECT_TRUE(pool.Plan(x, 500).reason.ok());
  EXPECT_EQ(pool.Plan(x, 724).kind, Kind::kAdmit);  // 300 + 724 = the budget exactly
  EXPECT_EQ(pool.Plan(x, 725).kind, Kind::kEvict);
}

TEST(AdmissionTest, RejectsAModelBiggerThanTheBudget) {
  Pool pool;
  AdmissionPlan plan = pool.Plan(x, 1536);
  EXPECT_EQ(plan.kind, Kind::kReject);
  EXPECT_EQ(plan.reason.code(), Code::kResourceExhausted);
  EXPECT_TRUE(Contains(plan.reason.message(), "model \"x\" needs 1.5 GiB but the device budget is 1.0 GiB"))
      << plan.reason.message();
  EXPECT_TRUE(Contains(plan.reason.message(), "raise --budget or [pool] budget"));
}

TEST(AdmissionTest, EvictsLeastRecentlyUsedFirstAndJustEnough) {
  Pool pool;
  uint32_t a = pool.Add("a", 300), b = pool.Add("b", 300), c = pool.Add("c", 300);
  EXPECT_EQ(pool.Plan(x, 400).victims, (Victims{a}));  // 900 + 400 > 1024; without a: 1000
  EXPECT_EQ(pool.Plan(x, 600).kind, Kind::kEvict);
  EXPECT_EQ(pool.Plan(x, 600).victims, (Victims{a, b}));
  pool.Touch(a);  // now b, c, a
  EXPECT_EQ(pool.Plan(x, 600).victims, (Victims{b, c}));
  EXPECT_EQ(pool.Plan(x, 1000).victims, (Victims{b, c, a}));
}

TEST(AdmissionTest, NeverEvictsTheModelBeingAdmitted) {
  Pool pool;
  uint32_t a = pool.Add("a", 300, Where::kParked), b = pool.Add("b", 300), c = pool.Add("c", 300);
  pool.Add("d", 300);
  AdmissionPlan plan = pool.Plan(a, 600);  // a (parked, least recently used) is the one asked for
  EXPECT_EQ(plan.kind, Kind::kEvict);
  EXPECT_EQ(plan.victims, (Victims{b, c}));
}

TEST(AdmissionTest, WaitsWhenOnlyBusyOrSettlingModelsAreInTheWay) {
  Pool pool;
  uint32_t a = pool.Add("a", 600);
  pool.Get(a).busy = true;
  pool.Add("b", 300, Where::kSettling);
  AdmissionPlan plan = pool.Plan(x, 400);
  EXPECT_EQ(plan.kind, Kind::kWait);
  EXPECT_TRUE(plan.victims.empty());
  EXPECT_TRUE(plan.reason.ok());
}

TEST(AdmissionTest, SkipsBusyModelsAndEvictsIdleOnesBehindThem) {
  Pool pool;
  uint32_t a = pool.Add("a", 300);
  pool.Get(a).busy = true;  // least recently used, but busy
  uint32_t b = pool.Add("b", 300);
  pool.Add("c", 300);
  EXPECT_EQ(pool.Plan(x, 400).victims, (Victims{b}));
}

TEST(AdmissionTest, EvictsWhatItCanWhenBusyModelsMustStillFinish) {
  Pool pool;
  uint32_t a = pool.Add("a", 500);
  pool.Get(a).busy = true;
  uint32_t b = pool.Add("b", 300);
  AdmissionPlan plan = pool.Plan(x, 600);  // even without b: 500 + 600 > 1024
  EXPECT_EQ(plan.kind, Kind::kEvict);
  EXPECT_EQ(plan.victims, (Victims{b}));
}

TEST(AdmissionTest, CapacityForcesEvictionWithBytesFree) {
  Pool pool;
  uint32_t a = pool.Add("a", 100), b = pool.Add("b", 100);
  EXPECT_EQ(pool.Plan(x, 100, /*capacity=*/3).kind, Kind::kAdmit);
  EXPECT_EQ(pool.Plan(x, 100, /*capacity=*/2).victims, (Victims{a}));
  EXPECT_EQ(pool.Plan(x, 100, /*capacity=*/1).victims, (Victims{a, b}));
  pool.Get(a).busy = true;
  EXPECT_EQ(pool.Plan(x, 100, /*capacity=*/2).victims, (Victims{b}));
}

TEST(AdmissionTest, ParkedModelsTakeNoDeviceRoom) {
  Pool pool;
  pool.Add("a", 600, Where::kParked);
  pool.Add("b", 100);
  EXPECT_EQ(pool.Plan(x, 900, /*capacity=*/2).kind, Kind::kAdmit);
}

TEST(AdmissionTest, LeavingBytesCountAsComingBack) {
  Pool pool;
  pool.Add("a", 500, Where::kLeaving);
  pool.Add("b", 300);
  AdmissionPlan plan = pool.Plan(x, 500);  // 800 + 500 > 1024, but 300 + 500 fits once a is gone
  EXPECT_EQ(plan.kind, Kind::kWait);
  EXPECT_TRUE(plan.victims.empty());
}

TEST(AdmissionTest, LeavingBytesReduceTheVictimsNeeded) {
  Pool pool;
  pool.Add("a", 300, Where::kLeaving);
  uint32_t b = pool.Add("b", 300);
  pool.Add("c", 300);
  AdmissionPlan plan = pool.Plan(x, 600);  // 900 - 300 leaving = 600; + 600 needs b gone too
  EXPECT_EQ(plan.kind, Kind::kEvict);
  EXPECT_EQ(plan.victims, (Victims{b}));
}

TEST(AdmissionTest, LeavingModelsFreeCapacityToo) {
  Pool pool;
  pool.Add("a", 100, Where::kLeaving);
  pool.Add("b", 100);
  EXPECT_EQ(pool.Plan(x, 100, /*capacity=*/2).kind, Kind::kWait);
}

TEST(AdmissionTest, RejectsNamingPinnedModelsWhenEverythingIsPinned) {
  Pool pool;
  pool.Get(pool.Add("alpha", 500)).pinned = true;
  pool.Get(pool.Add("beta", 500)).pinned = true;
  AdmissionPlan plan = pool.Plan(x, 500);
  EXPECT_EQ(plan.kind, Kind::kReject);
  EXPECT_EQ(plan.reason.code(), Code::kResourceExhausted);
  EXPECT_TRUE(Contains(plan.reason.message(), "no room for model \"x\" (500.0 MiB)")) << plan.reason.message();
  EXPECT_TRUE(Contains(plan.reason.message(), "1000.0 MiB of 1.0 GiB in use, pinned: alpha, beta"))
      << plan.reason.message();
  EXPECT_TRUE(Contains(plan.reason.message(), "unpin or unload a model"));
}

TEST(AdmissionTest, PinnedModelsAreSkippedNotEvicted) {
  Pool pool;
  pool.Get(pool.Add("a", 400)).pinned = true;
  uint32_t b = pool.Add("b", 400);
  EXPECT_EQ(pool.Plan(x, 400).victims, (Victims{b}));
}

TEST(AdmissionTest, PinnedAndBusyMeansWait) {
  Pool pool;
  pool.Get(pool.Add("a", 500)).pinned = true;
  pool.Get(pool.Add("b", 500)).busy = true;
  EXPECT_EQ(pool.Plan(x, 500).kind, Kind::kWait);
}

TEST(AdmissionTest, UnlimitedBudgetOnlyCapacityLimits) {
  Pool pool;
  uint32_t a = pool.Add("a", 100000);
  EXPECT_EQ(pool.Plan(x, 1 << 20, 0, /*budget_mib=*/0).kind, Kind::kAdmit);
  AdmissionPlan plan = pool.Plan(x, 1, /*capacity=*/1, /*budget_mib=*/0);
  EXPECT_EQ(plan.kind, Kind::kEvict);
  EXPECT_EQ(plan.victims, (Victims{a}));
}

// Several devices: each weighs its own residents against its own budget.
std::vector<DeviceRoom> Rooms(const Pool& pool, std::vector<uint64_t> budgets_mib,
                              std::vector<bool> up = {}) {
  std::vector<DeviceRoom> rooms;
  for (uint32_t d = 0; d < budgets_mib.size(); d++) {
    uint64_t used = 0;
    for (const Resident& r : pool.lru()) used += r.where != Where::kParked && r.device == d ? r.device_bytes : 0;
    bool is_up = up.empty() || up[d];
    rooms.push_back(DeviceRoom{d, used, budgets_mib[d] * kMiB, true, is_up});
  }
  return rooms;
}

PlacementPlan Place(const Pool& pool, uint64_t mib, const std::vector<DeviceRoom>& rooms) {
  return PlanPlacement(pool.lru(), x, "x", mib * kMiB, rooms, Limits{});
}

TEST(PlacementAcrossDevicesTest, AdmitsWhereTheMostRoomIsLeft) {
  Pool pool;
  pool.Add("a", 600, Where::kDevice, 0);
  pool.Add("b", 200, Where::kDevice, 1);
  PlacementPlan p = Place(pool, 300, Rooms(pool, {1024, 1024}));
  EXPECT_EQ(p.plan.kind, Kind::kAdmit);
  EXPECT_EQ(p.device, 1u);
  // Device 1 is smaller: 1024 - 600 - 300 = 124 left on device 0, 500 - 200 - 300 = 0 on device 1.
  p = Place(pool, 300, Rooms(pool, {1024, 500}));
  EXPECT_EQ(p.device, 0u);
  // Room on a device whose worker is starting: wait for it rather than evict elsewhere, but load
  // now where a worker is up and there is room.
  std::vector<DeviceRoom> starting = Rooms(pool, {1024, 1024}, {true, false});
  starting[1].coming = true;
  p = Place(pool, 300, starting);
  EXPECT_EQ(p.plan.kind, Kind::kAdmit);
  EXPECT_EQ(p.device, 0u);
  p = Place(pool, 500, starting);
  EXPECT_EQ(p.plan.kind, Kind::kAdmit) << "device 0 would have to evict";
  EXPECT_EQ(p.device, 1u);
}

TEST(PlacementAcrossDevicesTest, EvictsOnTheDeviceWhoseVictimsWereUsedLeastRecently) {
  Pool pool;
  uint32_t a = pool.Add("a", 600, Where::kDevice, 0);
  uint32_t b = pool.Add("b", 600, Where::kDevice, 1);
  PlacementPlan p = Place(pool, 600, Rooms(pool, {1024, 1024}));
  EXPECT_EQ(p.plan.kind, Kind::kEvict);
  EXPECT_EQ(p.device, 0u);
  EXPECT_EQ(p.plan.victims, (Victims{a}));
  pool.Touch(a);
  p = Place(pool, 600, Rooms(pool, {1024, 1024}));
  EXPECT_EQ(p.device, 1u);
  EXPECT_EQ(p.plan.victims, (Victims{b}));
}

TEST(PlacementAcrossDevicesTest, AReleaseUnderWayIsWaitedForNotDoubledElsewhere) {
  Pool pool;
  pool.Add("a", 600, Where::kLeaving, 0);  // evicted for this very load a moment ago
  pool.Add("b", 600, Where::kDevice, 1);
  PlacementPlan p = Place(pool, 600, Rooms(pool, {1024, 1024}));
  EXPECT_EQ(p.plan.kind, Kind::kWait);
  EXPECT_EQ(p.device, 0u);
  EXPECT_TRUE(p.plan.victims.empty());
}

TEST(PlacementAcrossDevicesTest, AnEvictionThatCannotMakeRoomYetRanksBelowOneThatDoes) {
  Pool pool;
  pool.Add("a1", 400, Where::kDevice, 0);                  // the oldest, idle
  pool.Get(pool.Add("a2", 500, Where::kDevice, 0)).busy = true;  // in the way until it finishes
  uint32_t b1 = pool.Add("b1", 600, Where::kDevice, 1);
  PlacementPlan p = Place(pool, 600, Rooms(pool, {1024, 1024}));
  EXPECT_EQ(p.plan.kind, Kind::kEvict);
  EXPECT_EQ(p.device, 1u) << "evicting a1 alone would not make room on device 0";
  EXPECT_EQ(p.plan.victims, (Victims{b1}));
}

TEST(PlacementAcrossDevicesTest, ARoomyDeviceWithNoWorkerComingWaitsBehindAnEviction) {
  Pool pool;
  uint32_t a = pool.Add("a", 600, Where::kDevice, 0);
  std::vector<DeviceRoom> rooms = Rooms(pool, {1024, 1024}, {true, false});
  PlacementPlan p = Place(pool, 600, rooms);  // device 1: its workers in a crash loop's backoff
  EXPECT_EQ(p.plan.kind, Kind::kEvict);
  EXPECT_EQ(p.device, 0u);
  EXPECT_EQ(p.plan.victims, (Victims{a}));
  rooms[1].coming = true;  // one is starting: worth the wait
  p = Place(pool, 600, rooms);
  EXPECT_EQ(p.plan.kind, Kind::kAdmit);
  EXPECT_EQ(p.device, 1u);
}

TEST(PlacementAcrossDevicesTest, RejectsOnlyWhenEveryDeviceRejects) {
  Pool pool;
  pool.Add("a", 100, Where::kDevice, 0);
  PlacementPlan p = Place(pool, 800, Rooms(pool, {1024, 512}));
  EXPECT_EQ(p.plan.kind, Kind::kAdmit);
  EXPECT_EQ(p.device, 0u);
  p = Place(pool, 2048, Rooms(pool, {1024, 512}));
  EXPECT_EQ(p.plan.kind, Kind::kReject);
  EXPECT_TRUE(Contains(p.plan.reason.message(), "the device budget is 1.0 GiB"))
      << "the largest device's reason: " << p.plan.reason.message();
  std::vector<DeviceRoom> none = Rooms(pool, {1024, 1024});
  for (DeviceRoom& r : none) r.can_load = false;
  p = Place(pool, 100, none);
  EXPECT_EQ(p.plan.kind, Kind::kWait);
  EXPECT_EQ(p.device, kNoDevice);
}

TEST(ParkTest, ParksOnlyWhatFitsTheParkBudget) {
  Limits limits{0, 0, 0, 1000};
  EXPECT_TRUE(ShouldPark(400, true, 600, limits));
  EXPECT_FALSE(ShouldPark(401, true, 600, limits));
  EXPECT_FALSE(ShouldPark(400, false, 0, limits)) << "no worker to copy the weights";
  EXPECT_FALSE(ShouldPark(0, true, 0, limits)) << "no weights";
  EXPECT_FALSE(ShouldPark(1, true, 0, Limits{})) << "parking off";
}

TEST(MaxCachedTest, DropsParkedCopiesFirstThenIdleModels) {
  Pool pool;
  uint32_t a = pool.Add("a", 10), p = pool.Add("p", 10, Where::kParked), b = pool.Add("b", 10);
  uint32_t q = pool.Add("q", 10, Where::kParked), c = pool.Add("c", 10);
  Limits limits{0, 0, 3, 0};
  EXPECT_EQ(PlanMaxCached(pool.lru(), c, limits), (Victims{p, q}));
  limits.max_cached = 2;
  EXPECT_EQ(PlanMaxCached(pool.lru(), c, limits), (Victims{p, q, a}));
  pool.Get(a).busy = true;
  pool.Get(b).pinned = true;
  limits.max_cached = 1;
  EXPECT_EQ(PlanMaxCached(pool.lru(), c, limits), (Victims{p, q})) << "never busy, pinned or kept";
  EXPECT_TRUE(PlanMaxCached(pool.lru(), c, Limits{}).empty()) << "0: unlimited";
}

TEST(ExpiryTest, IdleModelsPastTheirKeepAliveButNeverTheMostRecentOrTheOnly) {
  Pool pool;
  uint32_t a = pool.Add("a", 10), b = pool.Add("b", 10), c = pool.Add("c", 10);
  pool.Get(a).expires_at_ms = 100;
  pool.Get(b).expires_at_ms = 300;
  pool.Get(c).expires_at_ms = 100;  // the most recently used
  EXPECT_EQ(PlanExpiry(pool.lru(), 200), (Victims{a}));
  EXPECT_EQ(PlanExpiry(pool.lru(), 300), (Victims{a, b}));
  pool.Get(a).busy = true;
  pool.Get(b).pinned = true;
  EXPECT_TRUE(PlanExpiry(pool.lru(), 1000).empty());
  Pool one;
  one.Get(one.Add("only", 10)).expires_at_ms = 1;
  EXPECT_TRUE(PlanExpiry(one.lru(), 1000).empty());
}

}  // namespace
}  // namespace warmpool::supervisor::policy
