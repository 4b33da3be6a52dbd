// A KV pool's region as another process reads it after its writer died (engines/transformer/
// kv_region.h): the records name each sequence's positions, a reader finds the longest run of them
// for its tokens and copies their keys and values, and at no instant — between a pass's Prepare
// and its Commit, halfway through its writes, in a record's own update — does a record claim a
// position whose keys and values are not those of the tokens it names.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <bit>
#include <random>
#include <string>
#include <vector>

#include "engines/transformer/kv_cache.h"
#include "tests/unit/kv_pool_fixture.h"
#include "tests/unit/vm_flags.h"

// Its own namespace: the unity build compiles it with kv_cache_test.cc, whose helpers are alike.
namespace warmpool::transformer::kv_region_test {
namespace {

using kv_fixture::Pass;
using kv_fixture::KeyOf;
using kv_fixture::PoolOf;
using kv_fixture::SmallShape;
using kv_fixture::Tokens;
using kv_fixture::WriteAt;

Result<KvRegion> Reader(const KvPool& pool, const Config& c) {
  return KvRegion::Open(pool.region().handle(), pool.region().bytes(), c.num_hidden_layers, c.kv_size(),
                        pool.region().blocks(), c.kv_element);
}

// Every position the reader would take for `tokens` holds exactly their keys and values.
uint32_t CheckClaims(const KvRegion& reader, const std::vector<int32_t>& tokens) {
  uint32_t at = 0;
  for (const KvRegion::Extent& e : reader.Longest(tokens, static_cast<uint32_t>(tokens.size()))) {
    for (uint32_t i = 0; i < e.count; ++i, ++at) {
      for (uint32_t layer = 0; layer < 2; ++layer) {
        const float* key = static_cast<const float*>(reader.data()) + reader.RowsAt(e.block, layer, 0, i);
        const float* value = static_cast<const float*>(reader.data()) + reader.RowsAt(e.block, layer, 1, i);
        EXPECT_EQ(key[0], KeyOf(tokens, at, layer)) << "position " << at << " of block " << e.block;
        EXPECT_EQ(value[3], -KeyOf(tokens, at, layer) - 3);
      }
    }
  }
  return at;
}

TEST(KvRegionTest, AnotherPoolFindsASequencesPositionsAndCopiesTheirKeysAndValues) {
  const Config c = SmallShape();
  std::unique_ptr<KvPool> dead = PoolOf(c, KvPoolBlocks(512, 2));
  KvCache written(*dead, 512);
  std::vector<int32_t> tokens = Tokens(5, 150);
  Pass(written, tokens, 0);
  tokens.push_back(7);
  Pass(written, tokens, 150);  // a decode step: one position more

  Result<KvRegion> reader = Reader(*dead, c);
  ASSERT_TRUE(reader.ok()) << reader.status().message();
  const std::vector<KvRegion::Extent> run = reader->Longest(tokens, 500);
  ASSERT_EQ(run.size(), 3u);
  EXPECT_EQ(run[0].count, 64u);
  EXPECT_EQ(run[1].count, 64u);
  EXPECT_EQ(run[2].count, 23u) << "the last block's part";
  EXPECT_EQ(CheckClaims(*reader, tokens), 151u);
  EXPECT_EQ(reader->Longest(tokens, 100).back().count, 36u) << "no more than asked for";
  std::vector<int32_t> other = tokens;
  other[70] = 9999;
  EXPECT_EQ(CheckClaims(*reader, other), 70u) << "a different token ends the run within its block";

  // A fresh pool (a replica, the respawned worker) copies them: what it computes next reads them.
  std::unique_ptr<KvPool> fresh = PoolOf(c, KvPoolBlocks(512, 2));
  KvCache resumed(*fresh, 512);
  EXPECT_EQ(resumed.Reuse(tokens, 150), 0u) << "its own pool holds nothing yet";
  EXPECT_EQ(resumed.Import(*reader, tokens, 150), 150u) << "all but the last token, whose logits are wanted";
  for (uint32_t p = 0; p < 150; ++p) {
    EXPECT_EQ(resumed.key(1, p)[2], KeyOf(tokens, p, 1) + 2) << p;
    EXPECT_EQ(resumed.value(0, p)[0], -KeyOf(tokens, p, 0)) << p;
  }
  EXPECT_EQ(fresh->blocks().counts().held, 3u);
  std::vector<int32_t> more = tokens;
  more.resize(200, 11);
  Pass(resumed, more, 150);  // it goes on as any sequence
  EXPECT_EQ(resumed.length(), 200u);
  resumed.Clear();
  // What a dead worker left may be anything its fault wrote: it serves the resumed sequence alone.
  EXPECT_EQ(fresh->blocks().counts().cached, 0u) << "copied blocks, and those after them, join no prefix cache";
  EXPECT_TRUE(fresh->blocks().Consistent());
  KvCache again(*fresh, 512);
  EXPECT_EQ(again.Reuse(more, 199), 0u);
}

// A pool's keys and values ask for 2 MiB pages (common/huge_pages.h): every decode step reads them.
// So does a reader's mapping of another process's pool.
TEST(KvRegionTest, APoolsMappingsAskForHugePages) {
  if (!warmpool::testing::HugePageAdviceShows()) GTEST_SKIP() << "this kernel shows no huge page advice";
  const Config c = SmallShape();
  std::unique_ptr<KvPool> pool = PoolOf(c, 4);
  EXPECT_NE(warmpool::testing::VmFlagsOf(pool->region().data()).find(" hg "), std::string::npos);
  Result<KvRegion> reader = Reader(*pool, c);
  ASSERT_TRUE(reader.ok());
  EXPECT_NE(warmpool::testing::VmFlagsOf(reader->data()).find(" hg "), std::string::npos);
}

// A bf16 element at (position, layer, d, half), exactly representable: what a bf16 pool's tests
// write and expect back.
uint16_t Bf16At(uint32_t position, uint32_t layer, uint32_t d, uint32_t half) {
  const float x = static_cast<float>((position * 4 + layer * 2 + d) % 200 + 1) * (half == 0 ? 1.0f : -1.0f);
  return static_cast<uint16_t>(std::bit_cast<uint32_t>(x) >> 16);
}

void WriteBf16(KvCache& cache, const std::vector<int32_t>& tokens, uint32_t start) {
  ASSERT_TRUE(cache.Prepare(start, static_cast<uint32_t>(tokens.size())).ok());
  for (uint32_t p = start; p < tokens.size(); ++p) {
    for (uint32_t layer = 0; layer < 2; ++layer) {
      for (uint32_t d = 0; d < 4; ++d) {
        cache.key_bf16(layer, p)[d] = Bf16At(p, layer, d, 0);
        cache.value_bf16(layer, p)[d] = Bf16At(p, layer, d, 1);
      }
    }
  }
  cache.Commit(start, std::span<const int32_t>(tokens).subspan(start));
}

// Positions 0 .. count - 1 of `cache` hold what WriteBf16 wrote.
void ExpectBf16(KvCache& cache, uint32_t count, const std::string& what) {
  for (uint32_t p = 0; p < count; ++p) {
    for (uint32_t layer = 0; layer < 2; ++layer) {
      for (uint32_t d = 0; d < 4; ++d) {
        ASSERT_EQ(cache.key_bf16(layer, p)[d], Bf16At(p, layer, d, 0)) << what << " at " << p;
        ASSERT_EQ(cache.value_bf16(layer, p)[d], Bf16At(p, layer, d, 1)) << what << " at " << p;
      }
    }
  }
}

// A bf16 pool's blocks are half the bytes, and every way keys and values move between blocks and
// pools moves them whole: a shared block copied before it is rewritten, a dead worker's positions
// imported, a parked pool adopted.
TEST(KvRegionTest, ABf16PoolsKeysAndValuesMoveWholeBetweenBlocksAndPools) {
  Config c = SmallShape();
  c.kv_element = KvElement::kBF16;
  const uint32_t blocks = KvPoolBlocks(512, 2);
  std::unique_ptr<KvPool> pool = PoolOf(c, blocks);
  EXPECT_EQ(pool->region().BlockElements() * pool->region().element_bytes(), uint64_t{2} * 2 * 64 * 4 * 2);
  const std::vector<int32_t> tokens = Tokens(5, 150);
  KvCache written(*pool, 512);
  WriteBf16(written, tokens, 0);
  ExpectBf16(written, 150, "as written");

  // Another sequence shares the first block, then rewrites its last position: into a copy.
  KvCache sharer(*pool, 512);
  ASSERT_EQ(sharer.Reuse(tokens, 100), 64u);
  ASSERT_TRUE(sharer.Prepare(63, 64).ok());
  EXPECT_NE(sharer.blocks()[0], written.blocks()[0]) << "a block of its own";
  ExpectBf16(sharer, 63, "the shared block's copy");
  ExpectBf16(written, 150, "the original, untouched");
  sharer.Clear();

  // A fresh pool imports them from the region, as a resumed stream does.
  Result<KvRegion> reader =
      KvRegion::Open(pool->region().handle(), pool->region().bytes(), c.num_hidden_layers, c.kv_size(), blocks,
                     KvElement::kBF16);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  std::unique_ptr<KvPool> fresh = PoolOf(c, blocks);
  KvCache filler(*fresh, 512);  // its first block taken, the copies land in other blocks than their source's
  WriteBf16(filler, Tokens(900, 10), 0);
  KvCache resumed(*fresh, 512);
  ASSERT_EQ(resumed.Import(*reader, tokens, 149), 149u);
  EXPECT_NE(resumed.blocks()[0], written.blocks()[0]);
  ExpectBf16(resumed, 149, "imported");
  // An f32 pool of the same shape imports nothing from it.
  Config f32 = c;
  f32.kv_element = KvElement::kF32;
  std::unique_ptr<KvPool> other = PoolOf(f32, blocks);
  KvCache refused(*other, 512);
  EXPECT_EQ(refused.Import(*reader, tokens, 149), 0u);

  // The pool adopted by a later instance: its published blocks found again, their keys and values
  // intact.
  written.Clear();
  const int handle = fcntl(pool->region().handle(), F_DUPFD_CLOEXEC, 0);
  const uint64_t bytes = pool->region().bytes();
  pool.reset();
  Result<std::unique_ptr<KvPool>> adopted = KvPool::Adopt(c, blocks, handle, bytes);
  close(handle);
  ASSERT_TRUE(adopted.ok()) << adopted.status().ToString();
  KvCache again(**adopted, 512);
  ASSERT_EQ(again.Reuse(tokens, 149), 128u);
  ExpectBf16(again, 128, "adopted");
}

// A mirror's header and records (a GPU pool's, read back) take as many bytes whatever the element:
// only the header's element tells an f32 pool's from a bf16 one's, and a reader of the other
// element is refused.
TEST(KvRegionTest, RecordsReadBackAreRefusedByAReaderOfTheOtherElement) {
  const Config c = SmallShape();
  Result<KvRegion> whole = KvRegion::Create(c.num_hidden_layers, c.kv_size(), 4, KvElement::kF32);
  ASSERT_TRUE(whole.ok());
  const KvRegion::Span span = KvRegion::ImageSpan(c.num_hidden_layers, c.kv_size(), 4, KvElement::kF32);
  ASSERT_EQ(span.bytes, KvRegion::ImageSpan(c.num_hidden_layers, c.kv_size(), 4, KvElement::kBF16).bytes);
  std::vector<uint8_t> image(span.bytes);
  ASSERT_EQ(pread(whole->handle(), image.data(), image.size(), static_cast<off_t>(span.offset)),
            static_cast<ssize_t>(image.size()));
  EXPECT_TRUE(KvRegion::FromImage(image, c.num_hidden_layers, c.kv_size(), 4, KvElement::kF32).ok());
  EXPECT_FALSE(KvRegion::FromImage(image, c.num_hidden_layers, c.kv_size(), 4, KvElement::kBF16).ok());
}

TEST(KvRegionTest, ARegionOfAnotherShapeOrSizeIsRefused) {
  const Config c = SmallShape();
  std::unique_ptr<KvPool> pool = PoolOf(c, 4);
  const KvRegion& region = pool->region();
  const int h = region.handle();
  const uint64_t bytes = region.bytes();
  EXPECT_FALSE(KvRegion::Open(h, bytes, 3, c.kv_size(), 4, KvElement::kF32).ok()) << "other layers";
  EXPECT_FALSE(KvRegion::Open(h, bytes, 2, c.kv_size() * 2, 4, KvElement::kF32).ok()) << "other heads";
  EXPECT_FALSE(KvRegion::Open(h, bytes, 2, c.kv_size(), 4, KvElement::kBF16).ok()) << "bf16 elements";
  EXPECT_FALSE(KvRegion::Open(h, bytes, 2, c.kv_size() * 2, 4, KvElement::kBF16).ok())
      << "as many bytes, in bf16 elements of twice the heads";
  EXPECT_FALSE(KvRegion::Open(h, bytes, 2, c.kv_size(), 5, KvElement::kF32).ok())
      << "a pool of other blocks than the reader's";
  EXPECT_FALSE(KvRegion::Open(h, bytes - 288, 2, c.kv_size(), 4, KvElement::kF32).ok()) << "not whole blocks";
  EXPECT_FALSE(KvRegion::Open(h, 10, 2, c.kv_size(), 4, KvElement::kF32).ok());
  EXPECT_FALSE(KvRegion::Open(-1, bytes, 2, c.kv_size(), 4, KvElement::kF32).ok()) << "no descriptor";
  std::unique_ptr<KvPool> smaller = PoolOf(c, 3);
  EXPECT_FALSE(KvRegion::Open(smaller->region().handle(), bytes, 2, c.kv_size(), 4, KvElement::kF32).ok())
      << "a size its file does not have";
  // The same bytes in a memfd anyone holding it could shrink under a reader's mapping (SIGBUS).
  const int unsealed = memfd_create("unsealed", MFD_CLOEXEC);
  ASSERT_EQ(ftruncate(unsealed, static_cast<off_t>(bytes)), 0);
  ASSERT_EQ(pwrite(unsealed, region.data(), bytes, 0), static_cast<ssize_t>(bytes));
  EXPECT_FALSE(KvRegion::Open(unsealed, bytes, 2, c.kv_size(), 4, KvElement::kF32).ok())
      << "not sealed against resizing";
  close(unsealed);
  EXPECT_EQ(ftruncate(h, static_cast<off_t>(bytes / 2)), -1) << "the pool's own region cannot be shrunk";
  EXPECT_TRUE(KvRegion::Open(h, bytes, 2, c.kv_size(), 4, KvElement::kF32).ok());
}

TEST(KvRegionTest, ARewrittenPrefixNoLongerLeadsToWhatFollowedIt) {
  const Config c = SmallShape();
  std::unique_ptr<KvPool> pool = PoolOf(c, KvPoolBlocks(512, 1));
  KvCache cache(*pool, 512);
  const std::vector<int32_t> old = Tokens(1, 200);
  Pass(cache, old, 0);
  std::vector<int32_t> now = old;
  now.resize(40);
  now[30] = 777;
  Pass(cache, now, 30);  // rewritten from position 30: the old blocks after it are stale
  Result<KvRegion> reader = Reader(*pool, c);
  ASSERT_TRUE(reader.ok());
  EXPECT_EQ(CheckClaims(*reader, old), 30u) << "the old tokens: only what was not rewritten";
  std::vector<int32_t> now_then_old = now;
  now_then_old.insert(now_then_old.end(), old.begin() + 40, old.end());
  EXPECT_EQ(CheckClaims(*reader, now_then_old), 40u) << "the old second block is not the new first's child";
}

TEST(KvRegionTest, ARecordCaughtMidUpdateIsSkipped) {
  const Config c = SmallShape();
  std::unique_ptr<KvPool> pool = PoolOf(c, 4);
  KvCache cache(*pool, 256);
  const std::vector<int32_t> tokens = Tokens(3, 100);
  Pass(cache, tokens, 0);
  // A writer that died between a record's odd version and its even one: the records lie at the
  // region's end, block 1's second to last.
  const KvRegion& region = pool->region();
  void* map = mmap(nullptr, region.bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, region.handle(), 0);
  ASSERT_NE(map, MAP_FAILED);
  auto* version = reinterpret_cast<uint32_t*>(static_cast<uint8_t*>(map) + region.bytes() - 3 * sizeof(KvRecord));
  Result<KvRegion> reader = Reader(*pool, c);
  ASSERT_TRUE(reader.ok());
  EXPECT_EQ(CheckClaims(*reader, tokens), 100u);
  *version |= 1u;
  EXPECT_EQ(CheckClaims(*reader, tokens), 64u) << "block 1's record is skipped";
  munmap(map, region.bytes());
}

// Several sequences write, rewrite, share and give back blocks at random; a reader looks at the
// region at every instant a writer could die — after Prepare, halfway through a pass's writes,
// after Commit — and every position it would take holds the keys and values of the tokens named.
TEST(KvRegionTest, AtEveryInstantOfARandomRunTheRecordsClaimOnlyWhatIsWritten) {
  const Config c = SmallShape();
  constexpr uint32_t kContext = 256, kCaches = 3;
  std::unique_ptr<KvPool> pool = PoolOf(c, KvPoolBlocks(kContext, kCaches));
  std::vector<std::unique_ptr<KvCache>> caches;
  std::vector<std::vector<int32_t>> tokens(kCaches);
  for (uint32_t i = 0; i < kCaches; ++i) caches.push_back(std::make_unique<KvCache>(*pool, kContext));
  Result<KvRegion> reader = Reader(*pool, c);
  ASSERT_TRUE(reader.ok());
  std::mt19937 random(20261206);
  auto pick = [&](uint32_t n) { return static_cast<uint32_t>(random() % n); };
  uint64_t claimed = 0;
  std::vector<std::vector<int32_t>> history(24);
  uint64_t history_next = 0;
  for (int op = 0; op < 1200 && !::testing::Test::HasFailure(); ++op) {
    const uint32_t i = pick(kCaches);
    KvCache& cache = *caches[i];
    std::vector<int32_t>& mine = tokens[i];
    const uint32_t kind = pick(10);
    if (kind == 0) {  // the sequence ends; another begins from a prefix someone may have cached
      cache.Clear();
      mine = tokens[pick(kCaches)];
      mine.resize(std::min<size_t>(mine.size(), pick(kContext)));
      for (int32_t& t : mine) t = (random() % 8 == 0) ? static_cast<int32_t>(pick(4)) : t;
      mine.resize(cache.Reuse(mine, static_cast<uint32_t>(mine.size())));
      continue;
    }
    // A pass from a point at or before the end: a decode step, a prompt piece, or a rewrite.
    const uint32_t start = kind < 6 ? cache.length() : pick(cache.length() + 1);
    const uint32_t end = std::min(kContext, start + 1 + pick(kind < 4 ? 2 : 70));
    if (start >= end) continue;
    std::vector<int32_t> next(mine.begin(), mine.begin() + start);
    while (next.size() < end) next.push_back(static_cast<int32_t>(pick(4)));
    // What sequences held before (evicted prefixes, rewritten tails): their records must not
    // claim what new content overwrites.
    if (!mine.empty()) {
      history[history_next++ % history.size()] = mine;
    }
    auto check_all = [&] {
      for (const auto& t : tokens) claimed += CheckClaims(*reader, t);
      for (const auto& t : history) CheckClaims(*reader, t);
      CheckClaims(*reader, next);
    };
    if (!cache.Prepare(start, end).ok()) {
      mine.resize(cache.length());
      continue;
    }
    mine.resize(start);
    check_all();
    const uint32_t half = start + pick(end - start);
    for (uint32_t p = start; p < half; ++p) WriteAt(cache, next, p);
    check_all();  // a pass cut short
    for (uint32_t p = half; p < end; ++p) WriteAt(cache, next, p);
    cache.Commit(start, std::span<const int32_t>(next).subspan(start));
    mine = next;
    EXPECT_EQ(CheckClaims(*reader, mine), mine.size()) << "a sequence's own positions are all found";
    ASSERT_TRUE(pool->blocks().Consistent());
  }
  EXPECT_GT(claimed, 10000u) << "the run exercised the reader";
}

}  // namespace
}  // namespace warmpool::transformer::kv_region_test
