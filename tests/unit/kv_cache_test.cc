// The paged KV cache (engines/transformer/kv_blocks.h, kv_cache.h): blocks handed out, shared,
// published under their prefix, found again, evicted least recently used first; caches that reuse
// a prefix's blocks read what was written, and write into copies of what they share. The
// bookkeeping's invariants (every block in one state, the index naming exactly the published ones)
// hold after every operation of a random run.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>
#include <vector>

#include "engines/transformer/kv_cache.h"
#include "tests/unit/kv_pool_fixture.h"

namespace warmpool::transformer {
namespace {

std::vector<int32_t> Tokens(int32_t first, uint32_t count = kKvBlockTokens) {
  std::vector<int32_t> t(count);
  for (uint32_t i = 0; i < count; ++i) t[i] = first + static_cast<int32_t>(i);
  return t;
}

TEST(KvBlocksTest, FreeBlocksGoLowestFirstThenTheLeastRecentlyCachedAreEvicted) {
  KvBlocks blocks(3);
  EXPECT_EQ(blocks.Take(), 0u);
  EXPECT_EQ(blocks.Take(), 1u);
  EXPECT_EQ(blocks.Take(), 2u);
  EXPECT_EQ(blocks.Take(), std::nullopt) << "every block held";
  ASSERT_TRUE(blocks.Publish(1, KvBlocks::kRoot, Tokens(100)));
  ASSERT_TRUE(blocks.Publish(2, KvBlocks::kRoot, Tokens(200)));
  blocks.Release(2);  // cached first: the least recently used
  blocks.Release(1);
  EXPECT_EQ(blocks.counts().cached, 2u);
  EXPECT_EQ(blocks.Take(), 2u) << "the least recently cached block is evicted";
  EXPECT_EQ(blocks.Find(KvBlocks::kRoot, Tokens(200)), std::nullopt) << "evicted: its prefix is gone";
  EXPECT_EQ(blocks.Find(KvBlocks::kRoot, Tokens(100)), 1u);
  EXPECT_EQ(blocks.holders(1), 1u) << "found: held by its finder, no longer cached";
  EXPECT_EQ(blocks.counts().cached, 0u);
  blocks.Release(0);  // never published: free again
  EXPECT_EQ(blocks.counts().free, 1u);
  EXPECT_TRUE(blocks.Consistent());
}

TEST(KvBlocksTest, APrefixIsFoundBlockByBlockFromItsFirstAndOnlyByItsOwnTokens) {
  KvBlocks blocks(8);
  const uint32_t a = *blocks.Take(), b = *blocks.Take();
  ASSERT_TRUE(blocks.Publish(a, KvBlocks::kRoot, Tokens(0)));
  ASSERT_TRUE(blocks.Publish(b, blocks.LinkOf(a), Tokens(64)));
  EXPECT_FALSE(blocks.Publish(b, blocks.LinkOf(a), Tokens(64))) << "published already";
  const uint32_t c = *blocks.Take();
  EXPECT_FALSE(blocks.Publish(c, KvBlocks::kRoot, Tokens(0))) << "the same prefix is published by another block";
  const uint32_t d = *blocks.Take();
  EXPECT_FALSE(blocks.Publish(d, blocks.LinkOf(c), Tokens(64))) << "its parent is not published";
  EXPECT_FALSE(blocks.Publish(d, KvBlocks::kRoot, Tokens(0, 10))) << "not a whole block";

  EXPECT_EQ(blocks.Find(KvBlocks::kRoot, Tokens(0)), a);
  EXPECT_EQ(blocks.Find(blocks.LinkOf(a), Tokens(64)), b);
  std::vector<int32_t> other = Tokens(64);
  other[63] = 7;
  EXPECT_EQ(blocks.Find(blocks.LinkOf(a), other), std::nullopt) << "one token differs";
  EXPECT_EQ(blocks.Find(KvBlocks::kRoot, Tokens(64)), std::nullopt) << "the same tokens after another prefix";
  EXPECT_EQ(blocks.holders(a), 2u);
  EXPECT_TRUE(blocks.Consistent());
}

TEST(KvBlocksTest, ABlockRewrittenOrReusedCutsOffWhatFollowedIt) {
  KvBlocks blocks(2);
  const uint32_t a = *blocks.Take(), b = *blocks.Take();
  ASSERT_TRUE(blocks.Publish(a, KvBlocks::kRoot, Tokens(0)));
  const KvBlocks::Link old = blocks.LinkOf(a);
  ASSERT_TRUE(blocks.Publish(b, old, Tokens(64)));
  blocks.Release(b);
  blocks.Unpublish(a);  // its only holder rewrites it
  EXPECT_EQ(blocks.Find(KvBlocks::kRoot, Tokens(0)), std::nullopt);
  ASSERT_TRUE(blocks.Publish(a, KvBlocks::kRoot, Tokens(500)));  // new content, published again
  EXPECT_EQ(blocks.Find(blocks.LinkOf(a), Tokens(64)), std::nullopt)
      << "the old child does not follow the new content";
  EXPECT_TRUE(blocks.Consistent());
}

// Random takes, releases, publications and finds against a model of who holds what: a block Take
// hands out is never held, a found block is the one published for exactly that prefix, and the
// invariants hold after every step.
TEST(KvBlocksTest, RandomOperationsKeepEveryBlockInOneStateAndEveryFindExact) {
  std::mt19937 random(5);
  KvBlocks blocks(16);
  std::map<uint32_t, uint32_t> holders;                      // block -> holds taken by the test
  std::map<uint32_t, std::pair<KvBlocks::Link, int32_t>> published;  // block -> (parent, first token)
  std::vector<uint32_t> held;                                 // one entry per hold
  for (int step = 0; step < 20000; ++step) {
    switch (random() % 4) {
      case 0: {
        const std::optional<uint32_t> b = blocks.Take();
        if (!b) {
          EXPECT_EQ(blocks.counts().held, blocks.count());
          break;
        }
        ASSERT_EQ(holders[*b], 0u) << "a held block handed out again";
        published.erase(*b);  // evicted, if it was cached
        holders[*b] = 1;
        held.push_back(*b);
        break;
      }
      case 1:
        if (!held.empty()) {
          const size_t i = random() % held.size();
          const uint32_t b = held[i];
          held.erase(held.begin() + static_cast<long>(i));
          holders[b]--;
          blocks.Release(b);
        }
        break;
      case 2:
        if (!held.empty()) {
          const uint32_t b = held[random() % held.size()];
          const int32_t first = static_cast<int32_t>(random() % 4) * 64;
          KvBlocks::Link parent = KvBlocks::kRoot;
          if (!published.empty() && random() % 2 == 0) parent = blocks.LinkOf(published.begin()->first);
          if (blocks.Publish(b, parent, Tokens(first))) published[b] = {parent, first};
        }
        break;
      default: {
        const int32_t first = static_cast<int32_t>(random() % 4) * 64;
        KvBlocks::Link parent = KvBlocks::kRoot;
        if (!published.empty() && random() % 2 == 0) parent = blocks.LinkOf(published.rbegin()->first);
        const std::optional<uint32_t> b = blocks.Find(parent, Tokens(first));
        if (b) {
          ASSERT_TRUE(published.contains(*b));
          EXPECT_EQ(published[*b].first, parent);
          EXPECT_EQ(published[*b].second, first);
          holders[*b]++;
          held.push_back(*b);
        }
      }
    }
    ASSERT_TRUE(blocks.Consistent()) << "after step " << step;
  }
}

using kv_fixture::PoolOf;
using kv_fixture::SmallShape;

// Writes recognisable keys and values at positions start .. start + tokens - 1, and commits them.
void Write(KvCache& cache, uint32_t start, const std::vector<int32_t>& tokens, float mark) {
  ASSERT_TRUE(cache.Prepare(start, start + static_cast<uint32_t>(tokens.size())).ok());
  for (uint32_t i = 0; i < tokens.size(); ++i) {
    for (uint32_t layer = 0; layer < 2; ++layer) {
      for (uint32_t d = 0; d < 4; ++d) {
        cache.key(layer, start + i)[d] = mark + static_cast<float>(start + i);
        cache.value(layer, start + i)[d] = -mark - static_cast<float>(start + i);
      }
    }
  }
  cache.Commit(start, tokens);
}

TEST(KvCacheTest, ASequenceReusesTheWholePublishedBlocksOfItsPromptsPrefix) {
  const Config c = SmallShape();
  std::unique_ptr<KvPool> pool = PoolOf(c, KvPoolBlocks(512, 2));
  KvCache a(*pool, 512), b(*pool, 512);
  const std::vector<int32_t> prompt = Tokens(10, 150);
  Write(a, 0, prompt, 1000);
  EXPECT_EQ(b.Reuse(prompt, 149), 128u) << "two whole blocks; the third is not full";
  EXPECT_EQ(b.length(), 128u);
  for (uint32_t p = 0; p < 128; ++p) EXPECT_EQ(b.key(1, p)[3], 1000.0f + p);
  EXPECT_EQ(b.Reuse(prompt, 127), 64u) << "at most `most` positions";
  std::vector<int32_t> differs = prompt;
  differs[70] = 1;
  EXPECT_EQ(b.Reuse(differs, 149), 64u) << "the second block's tokens differ";
  differs[0] = 1;
  EXPECT_EQ(b.Reuse(differs, 149), 0u);
  EXPECT_TRUE(pool->blocks().Consistent());
}

TEST(KvCacheTest, ACacheWritesIntoACopyOfABlockItShares) {
  const Config c = SmallShape();
  std::unique_ptr<KvPool> pool = PoolOf(c, KvPoolBlocks(256, 2));
  KvCache a(*pool, 256), b(*pool, 256);
  const std::vector<int32_t> prompt = Tokens(10, 130);
  Write(a, 0, prompt, 1000);
  ASSERT_EQ(b.Reuse(prompt, 129), 128u);
  Write(b, 100, Tokens(7, 1), 5000);  // rewrites position 100, in a block both hold
  EXPECT_EQ(b.key(0, 100)[0], 5100.0f);
  EXPECT_EQ(a.key(0, 100)[0], 1100.0f) << "the other's block is untouched";
  EXPECT_EQ(b.key(0, 99)[0], 1099.0f) << "the copy keeps the positions before";
  EXPECT_EQ(b.length(), 101u);
  // The copy is b's own: a third cache still finds a's prefix, not b's rewrite.
  KvCache third(*pool, 256);
  EXPECT_EQ(third.Reuse(prompt, 129), 128u);
  EXPECT_EQ(third.key(1, 100)[2], 1100.0f);
  EXPECT_TRUE(pool->blocks().Consistent());
}

TEST(KvCacheTest, ClearedPrefixesStayCachedUntilAFullPoolEvictsTheLeastRecent) {
  const Config c = SmallShape();
  std::unique_ptr<KvPool> pool = PoolOf(c, 4);
  {
    KvCache a(*pool, 256);
    Write(a, 0, Tokens(0, 256), 1);
    a.Clear();
    EXPECT_EQ(pool->blocks().counts().cached, 4u);
    EXPECT_EQ(a.Reuse(Tokens(0, 256), 255), 192u) << "three blocks back from the cache";
    a.Clear();
    Write(a, 0, Tokens(9000, 128), 2);  // a new prompt takes two blocks: the least recent go
  }
  // Released child before parent: the eviction shortened the prefix from its end.
  KvCache b(*pool, 256);
  EXPECT_EQ(b.Reuse(Tokens(0, 256), 255), 128u);
  EXPECT_TRUE(pool->blocks().Consistent());
}

// A rewrite from an earlier position makes the cache hold only what comes before it until the
// rewrite is committed: a pass that failed halfway leaves no stale token named over new keys, and
// nothing of it is published.
TEST(KvCacheTest, ARewriteThatIsNeverCommittedLeavesOnlyThePositionsBeforeIt) {
  const Config c = SmallShape();
  std::unique_ptr<KvPool> pool = PoolOf(c, KvPoolBlocks(256, 2));
  KvCache a(*pool, 256), b(*pool, 256);
  Write(a, 0, Tokens(0, 100), 1);
  ASSERT_TRUE(a.Prepare(10, 20).ok());  // then the pass fails: no Commit
  EXPECT_EQ(a.length(), 10u);
  EXPECT_EQ(a.Prepare(50, 51).code(), Code::kInvalidArgument) << "a gap after the 10 positions it holds";
  Write(a, 10, Tokens(10, 60), 2);  // positions 10 .. 69 again, committed this time
  EXPECT_EQ(b.Reuse(Tokens(0, 70), 69), 64u);
  EXPECT_EQ(b.key(0, 20)[0], 2.0f + 20) << "the block published holds the rewrite";
  EXPECT_TRUE(pool->blocks().Consistent());
}

TEST(KvCacheTest, AGapAFullPoolAndThePastContextAreRefusedBeforeAnythingIsTaken) {
  const Config c = SmallShape();
  std::unique_ptr<KvPool> pool = PoolOf(c, 2);
  KvCache a(*pool, 128), b(*pool, 128);
  Write(a, 0, Tokens(0, 100), 1);
  EXPECT_EQ(a.Prepare(101, 102).code(), Code::kInvalidArgument) << "a gap after position 99";
  EXPECT_EQ(a.Prepare(120, 129).code(), Code::kInvalidArgument) << "past the context";
  EXPECT_EQ(b.Prepare(0, 1).code(), Code::kResourceExhausted) << "both blocks are a's";
  a.Clear();
  EXPECT_TRUE(b.Prepare(0, 1).ok()) << "a's unpublished block is free again";
  EXPECT_TRUE(pool->blocks().Consistent());
}

}  // namespace
}  // namespace warmpool::transformer
