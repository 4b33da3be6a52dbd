// The cuda backend's grants of device memory (supervisor/grants.h): every grant is released to its
// owner exactly once, when nobody needs it, and never while a model's weights live in it.
#include "supervisor/grants.h"

#include <gtest/gtest.h>

namespace warmpool::supervisor {
namespace {

constexpr uint32_t kDevice = 0, kSlot = 1, kGeneration = 3;

TEST(GrantTable, AGrantFreedByItsWorkerIsReleased) {
  GrantTable t;
  uint64_t g = t.Ask(kDevice, kSlot, kGeneration, 7);
  bool release = true;
  std::optional<GrantTable::Asker> asker = t.Answered(g, &release);
  ASSERT_TRUE(asker);
  EXPECT_FALSE(release);
  EXPECT_EQ(asker->request, 7u);
  EXPECT_FALSE(t.Freed(g, kSlot + 1)) << "not another worker's to free";
  std::optional<GrantRelease> r = t.Freed(g, kSlot);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->grant, g);
  EXPECT_FALSE(t.Freed(g, kSlot)) << "released once";
  EXPECT_EQ(t.size(), 0u);
}

TEST(GrantTable, WeightsAreReleasedWhenTheCoreLetsThemGoNotWhenTheirWorkerDies) {
  GrantTable t;
  uint64_t g = t.Ask(kDevice, kSlot, kGeneration, 1);
  bool release = false;
  ASSERT_TRUE(t.Answered(g, &release));
  EXPECT_FALSE(t.Kept(g, kSlot + 1, 40)) << "only the worker that asked names it";
  ASSERT_TRUE(t.Kept(g, kSlot, 40));
  EXPECT_FALSE(t.Freed(g, kSlot)) << "the worker unloading leaves the weights held";
  EXPECT_TRUE(t.WorkerGone(kSlot, kGeneration).empty()) << "a worker's death frees no weights";
  EXPECT_FALSE(t.Closed(41));
  std::optional<GrantRelease> r = t.Closed(40);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->grant, g);
  EXPECT_FALSE(t.Closed(40)) << "a descriptor number used again later is not this grant";
}

TEST(GrantTable, AGrantAbandonedBeforeTheOwnerAnswersIsReleasedWhenItDoes) {
  GrantTable t;
  uint64_t died = t.Ask(kDevice, kSlot, kGeneration, 1);
  uint64_t freed = t.Ask(kDevice, kSlot, kGeneration, 2);
  EXPECT_FALSE(t.Freed(freed, kSlot)) << "nothing to release before the owner has allocated";
  EXPECT_TRUE(t.WorkerGone(kSlot, kGeneration).empty());
  for (uint64_t g : {died, freed}) {
    bool release = false;
    EXPECT_FALSE(t.Answered(g, &release)) << "nobody to hand it to";
    EXPECT_TRUE(release) << "released on the answer, once";
  }
  EXPECT_EQ(t.size(), 0u);
}

TEST(GrantTable, ADeadWorkersAnsweredGrantsAreReleasedAndOthersKept) {
  GrantTable t;
  uint64_t mine = t.Ask(kDevice, kSlot, kGeneration, 1);
  uint64_t next_life = t.Ask(kDevice, kSlot, kGeneration + 1, 1);
  uint64_t other = t.Ask(kDevice, kSlot + 1, 1, 1);
  bool release = false;
  for (uint64_t g : {mine, next_life, other}) ASSERT_TRUE(t.Answered(g, &release));
  std::vector<GrantRelease> released = t.WorkerGone(kSlot, kGeneration);
  ASSERT_EQ(released.size(), 1u);
  EXPECT_EQ(released[0].grant, mine);
  EXPECT_EQ(t.size(), 2u);
}

TEST(GrantTable, AnOwnersDeathForgetsItsGrantsWithoutReleasing) {
  GrantTable t;
  uint64_t kept = t.Ask(kDevice, kSlot, kGeneration, 1);
  uint64_t asked = t.Ask(kDevice, kSlot, kGeneration, 2);
  uint64_t elsewhere = t.Ask(kDevice + 1, kSlot, kGeneration, 3);
  bool release = false;
  ASSERT_TRUE(t.Answered(kept, &release));
  ASSERT_TRUE(t.Kept(kept, kSlot, 50));
  t.OwnerGone(kDevice);
  EXPECT_FALSE(t.Closed(50)) << "nothing to release: it died with its owner";
  EXPECT_FALSE(t.Answered(asked, &release));
  EXPECT_FALSE(release) << "an answer from the dead owner's allocations is not released to the new one";
  EXPECT_TRUE(t.Answered(elsewhere, &release));
}

TEST(GrantTable, AWorkersOwnBytesAreThoseNotYetWeights) {
  GrantTable t;
  uint64_t weights = t.Ask(kDevice, kSlot, kGeneration, 1, 100);
  t.Ask(kDevice, kSlot, kGeneration, 2, 20);
  t.Ask(kDevice, kSlot + 1, 1, 3, 5);
  EXPECT_EQ(t.Unkept(kSlot, kGeneration), 120u);
  bool release = false;
  ASSERT_TRUE(t.Answered(weights, &release));
  ASSERT_TRUE(t.Kept(weights, kSlot, 9));
  EXPECT_EQ(t.Unkept(kSlot, kGeneration), 20u);
  EXPECT_EQ(t.Unkept(kSlot, kGeneration + 1), 0u);
}

TEST(GrantTable, ARefusedGrantIsForgotten) {
  GrantTable t;
  uint64_t g = t.Ask(kDevice, kSlot, kGeneration, 1);
  t.Refused(g);
  EXPECT_EQ(t.size(), 0u);
  EXPECT_TRUE(t.WorkerGone(kSlot, kGeneration).empty());
}

}  // namespace
}  // namespace warmpool::supervisor
