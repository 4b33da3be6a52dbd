// A KV pool taken over by a later instance of its model (KvPool::Adopt: a parked model unparked, a
// daemon restarted): the prefixes the earlier pool kept are found again, whole blocks only, keys and
// values as written; a record its writer left mid-update keeps neither its block nor what follows
// it; the adopted blocks are evicted deepest first, like any; and what the new pool writes can be
// adopted once more.
#include <sys/mman.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "engines/transformer/kv_cache.h"
#include "tests/unit/kv_pool_fixture.h"

// Its own namespace: the unity build compiles it with the other KV cache tests.
namespace warmpool::transformer::kv_adopt_test {
namespace {

using kv_fixture::KeyOf;
using kv_fixture::Pass;
using kv_fixture::PoolOf;
using kv_fixture::SmallShape;
using kv_fixture::Tokens;

// The region's descriptor as the supervisor keeps it when the pool's instance closes.
struct Kept {
  int handle = -1;
  uint64_t bytes = 0;
  uint32_t blocks = 0;
  explicit Kept(const KvPool& pool)
      : handle(dup(pool.region().handle())), bytes(pool.region().bytes()), blocks(pool.region().blocks()) {}
  ~Kept() { close(handle); }
};

std::unique_ptr<KvPool> Adopted(const Config& c, const Kept& kept) {
  Result<std::unique_ptr<KvPool>> pool = KvPool::Adopt(c, kept.blocks, kept.handle, kept.bytes);
  EXPECT_TRUE(pool.ok()) << pool.status().ToString();
  return pool.ok() ? std::move(*pool) : nullptr;
}

// The positions a new sequence takes from the pool's prefix cache for `tokens`, checked to hold
// exactly their keys and values.
uint32_t Reused(KvPool& pool, const std::vector<int32_t>& tokens) {
  KvCache cache(pool, 512);
  const uint32_t reused = cache.Reuse(tokens, static_cast<uint32_t>(tokens.size()));
  for (uint32_t p = 0; p < reused; ++p) {
    for (uint32_t layer = 0; layer < 2; ++layer) {
      EXPECT_EQ(cache.key(layer, p)[1], KeyOf(tokens, p, layer) + 1) << "position " << p;
      EXPECT_EQ(cache.value(layer, p)[2], -KeyOf(tokens, p, layer) - 2) << "position " << p;
    }
  }
  return reused;
}

TEST(KvAdoptTest, ThePrefixesAnEarlierPoolKeptAreFoundAgainWholeBlocksOnly) {
  const Config c = SmallShape();
  const std::vector<int32_t> first = Tokens(5, 150);  // blocks 0 and 1 whole, 22 positions more
  std::vector<int32_t> second(first.begin(), first.begin() + 64);  // shares block 0, then its own
  const std::vector<int32_t> own = Tokens(900, 100);
  second.insert(second.end(), own.begin(), own.end());
  std::unique_ptr<Kept> kept;
  {
    std::unique_ptr<KvPool> earlier = PoolOf(c, KvPoolBlocks(512, 2));
    KvCache a(*earlier, 512), b(*earlier, 512);
    Pass(a, first, 0);
    ASSERT_EQ(b.Reuse(second, 164), 64u);
    Pass(b, second, 64);
    kept = std::make_unique<Kept>(*earlier);
    EXPECT_EQ(earlier->blocks().counts().held, 5u) << "block 0 shared, two more each";
  }  // the instance closed, its sequences with it: the region stays while a descriptor names it

  std::unique_ptr<KvPool> later = Adopted(c, *kept);
  ASSERT_NE(later, nullptr);
  EXPECT_EQ(later->blocks().counts().cached, 3u) << "block 0, and each sequence's block 1";
  EXPECT_EQ(later->blocks().counts().held, 0u);
  EXPECT_EQ(later->blocks().counts().free, later->blocks().count() - 3);
  EXPECT_TRUE(later->blocks().Consistent());
  EXPECT_GE(later->region().handle(), 0) << "a descriptor of its own, to export again";
  EXPECT_NE(later->region().handle(), kept->handle);
  EXPECT_EQ(Reused(*later, first), 128u);
  EXPECT_EQ(Reused(*later, second), 128u);
  // A partial block is no prefix: its record claims nothing now, for a reader after a crash too.
  Result<KvRegion> reader = KvRegion::Open(later->region().handle(), later->region().bytes(), c.num_hidden_layers,
                                           c.kv_size(), later->region().blocks(), c.kv_element);
  ASSERT_TRUE(reader.ok());
  uint32_t claimed = 0;
  for (const KvRegion::Extent& e : reader->Longest(first, 150)) claimed += e.count;
  EXPECT_EQ(claimed, 128u);

  // The new pool goes on as any: a sequence extends the prefix, and a third pool adopts that.
  std::vector<int32_t> longer = first;
  longer.resize(200, 17);
  {
    KvCache cache(*later, 512);
    ASSERT_EQ(cache.Reuse(longer, 200), 128u);
    Pass(cache, longer, 128);
  }
  Kept again(*later);
  later.reset();
  std::unique_ptr<KvPool> third = Adopted(c, again);
  ASSERT_NE(third, nullptr);
  EXPECT_EQ(Reused(*third, longer), 192u);
  EXPECT_EQ(Reused(*third, second), 128u);
  EXPECT_TRUE(third->blocks().Consistent());
}

// Keys and values a resumed sequence copied from a dead worker's region serve that sequence alone
// (KvCache::Import): neither they nor what it computed after them join the prefix cache of an
// instance that adopts its pool later, while another sequence's prefixes in the same pool do.
TEST(KvAdoptTest, WhatASequenceCopiedFromADeadWorkerIsNotKeptByTheNextInstance) {
  const Config c = SmallShape();
  const std::vector<int32_t> resumed = Tokens(7, 200), other = Tokens(500, 130);
  std::unique_ptr<KvPool> dead = PoolOf(c, KvPoolBlocks(512, 2));
  {
    KvCache cache(*dead, 512);
    Pass(cache, std::vector<int32_t>(resumed.begin(), resumed.begin() + 150), 0);
  }
  Result<KvRegion> source = KvRegion::Open(dead->region().handle(), dead->region().bytes(), c.num_hidden_layers,
                                           c.kv_size(), dead->region().blocks(), c.kv_element);
  ASSERT_TRUE(source.ok());
  std::unique_ptr<KvPool> earlier = PoolOf(c, KvPoolBlocks(512, 2));
  {
    KvCache a(*earlier, 512), b(*earlier, 512);
    ASSERT_EQ(a.Reuse(resumed, 200), 0u);
    ASSERT_EQ(a.Import(*source, resumed, 150), 150u);
    Pass(a, resumed, 150);  // computed on top of what it copied
    Pass(b, other, 0);
  }
  Kept kept(*earlier);
  earlier.reset();
  std::unique_ptr<KvPool> later = Adopted(c, kept);
  ASSERT_NE(later, nullptr);
  EXPECT_EQ(Reused(*later, resumed), 0u) << "not the copied blocks, nor the one computed after them";
  EXPECT_EQ(Reused(*later, other), 128u);
  EXPECT_EQ(later->blocks().counts().cached, 2u);
}

TEST(KvAdoptTest, ARecordLeftMidUpdateKeepsNeitherItsBlockNorWhatFollows) {
  const Config c = SmallShape();
  const std::vector<int32_t> tokens = Tokens(3, 256);  // blocks 0 to 3, in that order
  std::unique_ptr<KvPool> earlier = PoolOf(c, 8);
  {
    KvCache cache(*earlier, 512);
    Pass(cache, tokens, 0);
  }
  const KvRegion& region = earlier->region();
  void* map = mmap(nullptr, region.bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, region.handle(), 0);
  ASSERT_NE(map, MAP_FAILED);
  // Block 2's record (the records lie at the region's end, one per block) made odd.
  auto* version = reinterpret_cast<uint32_t*>(static_cast<uint8_t*>(map) + region.bytes() - 6 * sizeof(KvRecord));
  *version |= 1u;
  munmap(map, region.bytes());
  Kept kept(*earlier);
  earlier.reset();
  std::unique_ptr<KvPool> later = Adopted(c, kept);
  ASSERT_NE(later, nullptr);
  EXPECT_EQ(later->blocks().counts().cached, 2u);
  EXPECT_EQ(Reused(*later, tokens), 128u);
  EXPECT_TRUE(later->blocks().Consistent());
}

TEST(KvAdoptTest, AdoptedBlocksAreEvictedDeepestFirst) {
  const Config c = SmallShape();
  const std::vector<int32_t> tokens = Tokens(40, 256);
  std::unique_ptr<KvPool> earlier = PoolOf(c, 4);
  {
    KvCache cache(*earlier, 256);
    Pass(cache, tokens, 0);
  }
  Kept kept(*earlier);
  earlier.reset();
  std::unique_ptr<KvPool> later = Adopted(c, kept);
  ASSERT_NE(later, nullptr);
  ASSERT_EQ(later->blocks().counts().cached, 4u);
  KvCache other(*later, 256);
  ASSERT_TRUE(other.Prepare(0, 1).ok()) << "a cached block is taken when none is free";
  EXPECT_EQ(later->blocks().counts().cached, 3u);
  EXPECT_EQ(Reused(*later, tokens), 192u) << "the prefix shortened from its end, not cut at its start";
}

TEST(KvAdoptTest, ARegionThatIsNotAPoolOfThisShapeIsRefused) {
  const Config c = SmallShape();
  std::unique_ptr<KvPool> earlier = PoolOf(c, 4);
  Kept kept(*earlier);
  Config wider = c;
  wider.head_dim = 8;
  EXPECT_EQ(KvPool::Adopt(wider, 4, kept.handle, kept.bytes).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(KvPool::Adopt(c, 5, kept.handle, kept.bytes).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(KvPool::Adopt(c, 4, kept.handle, kept.bytes - 1).status().code(), Code::kInvalidArgument);
  const int unsealed = memfd_create("not-a-kv-pool", MFD_CLOEXEC);
  ASSERT_EQ(ftruncate(unsealed, static_cast<off_t>(kept.bytes)), 0);
  EXPECT_EQ(KvPool::Adopt(c, 4, unsealed, kept.bytes).status().code(), Code::kInvalidArgument);
  close(unsealed);
  EXPECT_NE(Adopted(c, kept), nullptr) << "the pool itself is";
}

}  // namespace
}  // namespace warmpool::transformer::kv_adopt_test
