// ModelIndex::Validate catches injected corruption: links that cycle or point nowhere, a wrong tail
// or length, accounts that disagree with the records, residents without a worker, over-budget
// devices, and in-flight slots of dead or old workers (the fixture: model_index_fixture.h).
#include "tests/unit/model_index_fixture.h"

namespace warmpool::shm {
namespace {

// Corruption injected through the raw view must be reported.
class ValidateCorruptionTest : public ModelIndexTest {
 protected:
  void SetUp() override {
    a_ = Ready("a", 100, 0);
    b_ = Ready("b", 200, 1);
    c_ = Ready("c", 300, 2);
    r_ = Reg("r", 50);
    ExpectValid();
  }
  uint32_t a_, b_, c_, r_;
};

TEST_F(ValidateCorruptionTest, CycleInLruLinks) {
  view_.model(c_).lru_next = a_;
  EXPECT_TRUE(Contains(ValidateMessage(), "LRU list has a cycle at model 0"));
}

TEST_F(ValidateCorruptionTest, BrokenPrevLink) {
  view_.model(c_).lru_prev = a_;
  EXPECT_TRUE(Contains(ValidateMessage(), "LRU prev link of \"c\" is 0, expected 1"));
}

TEST_F(ValidateCorruptionTest, LinkOutOfRange) {
  view_.model(b_).lru_next = 77;
  EXPECT_TRUE(Contains(ValidateMessage(), "LRU link 77 out of range"));
}

TEST_F(ValidateCorruptionTest, WrongTail) {
  view_.header().lru_tail = b_;
  EXPECT_TRUE(Contains(ValidateMessage(), "LRU tail 1 but the walk ended at 2"));
}

TEST_F(ValidateCorruptionTest, WrongLength) {
  view_.header().lru_length = 4;
  EXPECT_TRUE(Contains(ValidateMessage(), "LRU length 4 but the list holds 3"));
}

TEST_F(ValidateCorruptionTest, AccountMismatch) {
  view_.header().device_used_bytes[0] += 7;
  EXPECT_TRUE(Contains(ValidateMessage(), "device 0 accounts 607 bytes but its resident models sum to 600"));
  view_.header().device_used_bytes[0] -= 7;
  view_.header().device_used_bytes[5] = 1;  // a device with nothing on it
  EXPECT_TRUE(Contains(ValidateMessage(), "device 5 accounts 1 bytes"));
}

TEST_F(ValidateCorruptionTest, ResidentButNotInLru) {
  view_.model(r_).state = static_cast<uint32_t>(ModelState::kReady);
  view_.model(r_).worker_slot = 0;
  EXPECT_TRUE(Contains(ValidateMessage(), "model \"r\" is ready but is not in the LRU list (in_lru=0)"));
}

TEST_F(ValidateCorruptionTest, NotResidentButInLru) {
  view_.model(b_).state = static_cast<uint32_t>(ModelState::kRegistered);
  EXPECT_TRUE(Contains(ValidateMessage(), "model \"b\" is registered but is in the LRU list"));
}

TEST_F(ValidateCorruptionTest, ResidentWithoutWorker) {
  view_.model(a_).worker_slot = kNil;
  EXPECT_TRUE(Contains(ValidateMessage(), "resident model \"a\" has no worker"));
}

TEST_F(ValidateCorruptionTest, OverBudget) {
  view_.header().device_budget_bytes[0] = 500;
  EXPECT_TRUE(Contains(ValidateMessage(), "device 0 holds 600 bytes, over its budget of 500"));
}

TEST_F(ValidateCorruptionTest, DuplicateNameAndUnknownState) {
  std::strcpy(view_.model(r_).name, "a");
  EXPECT_TRUE(Contains(ValidateMessage(), "model name \"a\" appears twice"));
  std::strcpy(view_.model(r_).name, "r");
  view_.model(r_).state = 9;
  EXPECT_TRUE(Contains(ValidateMessage(), "model \"r\" has unknown state 9"));
}

TEST_F(ValidateCorruptionTest, InflightSlotOfAnOldGeneration) {
  InflightTable table(view_);
  Result<uint32_t> live = table.Take(1, 2, 7, a_, 0);
  ASSERT_TRUE(live.ok());
  ExpectValid();
  view_.worker(2).generation = 2;  // worker 2 was respawned; its old slot was not reclaimed
  EXPECT_TRUE(Contains(ValidateMessage(),
                       "in-flight slot 0 is tagged by worker 2 generation 1, but that worker is at "
                       "generation 2 (alive)"));
  ASSERT_EQ(table.Reclaim(2, 1), 1u);
  ExpectValid();
}

TEST_F(ValidateCorruptionTest, InflightSlotOfADeadWorker) {
  InflightTable table(view_);
  ASSERT_TRUE(table.Take(1, 3, 7, a_, 0).ok());
  view_.worker(3).state = static_cast<uint32_t>(WorkerState::kDead);
  EXPECT_TRUE(Contains(ValidateMessage(), "generation 1 (dead)"));
}

TEST_F(ValidateCorruptionTest, InflightSlotNamingNoWorker) {
  view_.inflight(4).tag = MakeTag(1, 9, SlotState::kTaken);
  EXPECT_TRUE(Contains(ValidateMessage(), "in-flight slot 4 names worker 9 of 4"));
}

}  // namespace
}  // namespace warmpool::shm
