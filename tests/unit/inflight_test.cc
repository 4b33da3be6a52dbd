// The in-flight table: tagged Take/Release, Reclaim of a dead worker's (slot, generation), a full
// table, and many threads taking and releasing slots of a small table at once.
#include "shm/inflight.h"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "shm/segment.h"

namespace warmpool::shm {
namespace {

class InflightTest : public ::testing::Test {
 protected:
  explicit InflightTest(uint32_t slots = 8)
      : limits_{4, 8, slots}, bytes_(SegmentSize(limits_)), view_(FormatOrDie()), table_(view_) {}

  SegmentView FormatOrDie() {
    Result<SegmentView> v = SegmentView::Format(bytes_, limits_, {0}, 1);
    if (!v.ok()) {
      ADD_FAILURE() << v.status().ToString();
      return SegmentView();
    }
    return *v;
  }
  uint32_t MustTake(uint32_t generation, uint16_t worker, uint64_t request, uint32_t hint = 0) {
    Result<uint32_t> r = table_.Take(generation, worker, request, /*model=*/2, /*started=*/99, hint);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : kNil;
  }

  Limits limits_;
  std::vector<std::byte> bytes_;
  SegmentView view_;
  InflightTable table_;
};

TEST_F(InflightTest, TakeTagsTheSlotAndReleaseFreesIt) {
  uint32_t i = MustTake(5, 3, 1234);
  EXPECT_EQ(i, 0u);
  EXPECT_EQ(table_.Tag(i), MakeTag(5, 3, SlotState::kTaken));
  EXPECT_EQ(view_.inflight(i).request_id, 1234u);
  EXPECT_EQ(view_.inflight(i).model, 2u);
  EXPECT_EQ(view_.inflight(i).started_ns, 99u);
  EXPECT_EQ(table_.CountTaken(), 1u);
  EXPECT_EQ(table_.CountTakenBy(3), 1u);
  EXPECT_EQ(table_.CountTakenBy(4), 0u);
  EXPECT_TRUE(table_.Release(i, 5, 3));
  EXPECT_EQ(table_.Tag(i), 0u);
  EXPECT_EQ(table_.CountTaken(), 0u);
  EXPECT_FALSE(table_.Release(i, 5, 3));  // twice: nothing to release
}

TEST_F(InflightTest, TakeStartsAtTheHintAndWrapsAround) {
  EXPECT_EQ(MustTake(1, 0, 1, 6), 6u);
  EXPECT_EQ(MustTake(1, 0, 2, 6), 7u);
  EXPECT_EQ(MustTake(1, 0, 3, 6), 0u);
  EXPECT_EQ(MustTake(1, 0, 4, 14), 1u);  // 14 % 8 = 6, 7 and 0 taken
  EXPECT_EQ(table_.CountTaken(), 4u);
}

TEST_F(InflightTest, ReleaseWithAnotherTagFails) {
  uint32_t i = MustTake(5, 3, 1);
  EXPECT_FALSE(table_.Release(i, 4, 3));  // older generation of the same worker slot
  EXPECT_FALSE(table_.Release(i, 6, 3));
  EXPECT_FALSE(table_.Release(i, 5, 2));  // another worker
  EXPECT_FALSE(table_.Release(i + 1, 5, 3));  // a free slot
  EXPECT_FALSE(table_.Release(limits_.max_inflight, 5, 3));  // out of range
  EXPECT_FALSE(table_.Release(kNil, 5, 3));
  EXPECT_EQ(table_.Tag(i), MakeTag(5, 3, SlotState::kTaken));
  EXPECT_TRUE(table_.Release(i, 5, 3));
}

TEST_F(InflightTest, ReclaimFreesOnlyTheDeadWorkersGeneration) {
  uint32_t old1 = MustTake(1, 2, 10);
  uint32_t old2 = MustTake(1, 2, 11);
  uint32_t other = MustTake(1, 3, 12);      // another worker, same generation number
  uint32_t newer = MustTake(2, 2, 13);      // the respawned worker of slot 2
  uint32_t older = MustTake(0x7FFFFFFF, 2, 14);
  EXPECT_EQ(table_.CountTakenBy(2), 4u);

  EXPECT_EQ(table_.Reclaim(2, 1), 2u);
  EXPECT_EQ(table_.Tag(old1), 0u);
  EXPECT_EQ(table_.Tag(old2), 0u);
  EXPECT_EQ(table_.Tag(other), MakeTag(1, 3, SlotState::kTaken));
  EXPECT_EQ(table_.Tag(newer), MakeTag(2, 2, SlotState::kTaken));
  EXPECT_EQ(table_.Tag(older), MakeTag(0x7FFFFFFF, 2, SlotState::kTaken));
  EXPECT_EQ(table_.CountTaken(), 3u);
  EXPECT_EQ(table_.Reclaim(2, 1), 0u);  // idempotent

  // The dead worker's late release is a no-op and cannot free the slot someone else took since.
  uint32_t reused = MustTake(2, 2, 15);
  EXPECT_EQ(reused, old1);
  EXPECT_FALSE(table_.Release(old1, 1, 2));
  EXPECT_EQ(table_.Tag(reused), MakeTag(2, 2, SlotState::kTaken));
  EXPECT_EQ(table_.Reclaim(2, 2), 2u);
  EXPECT_EQ(table_.Reclaim(3, 1), 1u);
  EXPECT_EQ(table_.Reclaim(2, 0x7FFFFFFF), 1u);
  EXPECT_EQ(table_.CountTaken(), 0u);
}

TEST_F(InflightTest, FullTableIsResourceExhausted) {
  for (uint32_t k = 0; k < limits_.max_inflight; k++) MustTake(1, 0, k, k * 3);
  EXPECT_EQ(table_.CountTaken(), 8u);
  Result<uint32_t> r = table_.Take(1, 1, 100, 0, 0, 5);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kResourceExhausted);
  EXPECT_NE(r.status().message().find("full (8 slots): raise [limits] max_inflight"),
            std::string::npos)
      << r.status().message();
  ASSERT_TRUE(table_.Release(5, 1, 0));
  EXPECT_EQ(MustTake(1, 1, 101), 5u);  // the one free slot
}

TEST_F(InflightTest, SecondViewSeesTheSameTags) {
  Result<SegmentView> other = SegmentView::Attach(bytes_, "warmpool.test");
  ASSERT_TRUE(other.ok());
  InflightTable worker_side(*other);
  Result<uint32_t> i = worker_side.Take(7, 1, 55, 0, 0);
  ASSERT_TRUE(i.ok());
  EXPECT_EQ(table_.Tag(*i), MakeTag(7, 1, SlotState::kTaken));
  EXPECT_EQ(table_.Reclaim(1, 7), 1u);
  EXPECT_FALSE(worker_side.Release(*i, 7, 1));
}

class InflightConcurrencyTest : public InflightTest {
 protected:
  InflightConcurrencyTest() : InflightTest(16) {}
};

// Eight "workers" each hold up to two slots at a time in a 16-slot table, so a Take never finds the
// table full. A side array records who holds each slot: a Take that hands out a slot somebody else
// holds, or a Release that frees one we do not hold, shows up there.
TEST_F(InflightConcurrencyTest, NoSlotIsEverHeldTwice) {
  constexpr int kThreads = 8;
  constexpr int kRounds = 20000;
  std::vector<std::atomic<int>> owner(16);
  for (auto& o : owner) o.store(-1);
  std::atomic<int> double_takes{0}, lost_releases{0}, failed_takes{0}, wrong_tags{0};
  std::atomic<bool> go{false};

  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; t++) {
    threads.emplace_back([&, t] {
      const auto worker = static_cast<uint16_t>(t);
      const uint32_t generation = 100 + t;
      while (!go.load()) std::this_thread::yield();
      for (int round = 0; round < kRounds; round++) {
        uint32_t held[2];
        for (uint32_t& h : held) {
          Result<uint32_t> r = table_.Take(generation, worker, round, t, 0, t * 2);
          if (!r.ok()) {
            failed_takes++;
            h = kNil;
            continue;
          }
          h = *r;
          int expected = -1;
          if (!owner[h].compare_exchange_strong(expected, t)) double_takes++;
          if (table_.Tag(h) != MakeTag(generation, worker, SlotState::kTaken)) wrong_tags++;
        }
        for (uint32_t h : held) {
          if (h == kNil) continue;
          int expected = t;
          // Clear our mark before the slot becomes free, or the next taker could see it.
          if (!owner[h].compare_exchange_strong(expected, -1)) double_takes++;
          if (!table_.Release(h, generation, worker)) lost_releases++;
        }
      }
    });
  }
  go.store(true);
  for (auto& th : threads) th.join();

  EXPECT_EQ(double_takes.load(), 0);
  EXPECT_EQ(lost_releases.load(), 0);
  EXPECT_EQ(failed_takes.load(), 0);
  EXPECT_EQ(wrong_tags.load(), 0);
  EXPECT_EQ(table_.CountTaken(), 0u);
  for (auto& o : owner) EXPECT_EQ(o.load(), -1);
}

// A worker "dies" holding slots while others keep working; the supervisor's Reclaim frees exactly
// the dead worker's slots and none of the live ones.
TEST_F(InflightConcurrencyTest, ReclaimWhileOthersWork) {
  constexpr uint16_t kDead = 7;
  constexpr uint32_t kDeadGeneration = 3;
  for (int k = 0; k < 4; k++) {
    ASSERT_TRUE(table_.Take(kDeadGeneration, kDead, k, 0, 0, k * 4).ok());
  }
  std::atomic<bool> stop{false};
  std::atomic<int> lost_releases{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; t++) {
    threads.emplace_back([&, t] {
      const auto worker = static_cast<uint16_t>(t);
      // Generation 3 too: only the worker slot tells them apart from the dead one.
      for (int round = 0; round < 5000 || !stop.load(); round++) {
        Result<uint32_t> r = table_.Take(kDeadGeneration, worker, round, 0, 0, t);
        if (!r.ok()) continue;
        if (!table_.Release(*r, kDeadGeneration, worker)) lost_releases++;
        if (round > 1000000) break;
      }
    });
  }
  uint32_t freed = table_.Reclaim(kDead, kDeadGeneration);
  stop.store(true);
  for (auto& th : threads) th.join();
  EXPECT_EQ(freed, 4u);
  EXPECT_EQ(lost_releases.load(), 0);
  EXPECT_EQ(table_.CountTakenBy(kDead), 0u);
  EXPECT_EQ(table_.CountTaken(), 0u);
}

}  // namespace
}  // namespace warmpool::shm
