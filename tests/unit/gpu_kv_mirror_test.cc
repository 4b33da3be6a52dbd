// A GPU's KV pool as the supervisor holds it (engines/transformer/gpu_slots.h MakeGpuPool): the
// pool's own device region, its blocks' keys and values with the records mirrored after them, so
// that a stream resumed after its worker died copies what the dead pool holds instead of computing
// it, as on the CPU. On the model double (tests/unit/gpu_device_double.h), which checks after every
// write into the region and every write of its blocks that each record the mirror holds claims only
// tokens in place there — what a reader finds if the worker dies at that instant.
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "devmem/host_memory.h"
#include "engines/transformer/gpu_slots.h"
#include "engines/transformer/kv_cache.h"
#include "engines/transformer/kv_region.h"
#include "tests/unit/gpu_device_double.h"

namespace warmpool::testing {
namespace {

using transformer::KvRegion;
using transformer::KvElement;
using StepRun = transformer::SequenceSlots::Run;

// A GPU model's pool and slots on the double.
struct GpuRig {
  GpuRig(uint32_t context, uint32_t sequences, uint32_t blocks) : device(context, sequences, blocks) {
    Result<std::unique_ptr<transformer::KvPool>> made = transformer::MakeGpuPool(device);
    EXPECT_TRUE(made.ok()) << made.status().ToString();
    pool = std::move(*made);
    first = std::make_unique<transformer::KvCache>(*pool, context);
    slots = std::make_unique<transformer::GpuSlots>(device, *pool, *first, sequences);
  }
  // One step; each run's digest (from its logits).
  std::vector<int32_t> Step(std::vector<StepRun> runs) {
    std::vector<float> logits(runs.size() * uint64_t{kVocab});
    std::vector<int32_t> argmax(runs.size(), -1);
    const Status s = slots->Step(runs, logits, argmax);
    EXPECT_TRUE(s.ok()) << s.ToString();
    for (size_t i = 0; i < runs.size(); ++i) {
      const float* row = logits.data() + i * kVocab;
      argmax[i] = static_cast<int32_t>(std::max_element(row, row + kVocab) - row);
    }
    return argmax;
  }
  DeviceDouble device;
  std::unique_ptr<transformer::KvPool> pool;
  std::unique_ptr<transformer::KvCache> first;
  std::unique_ptr<transformer::GpuSlots> slots;
};

// `dead`'s pool, as the supervisor held it, taken by `prompt` starting in slot 0 of `rig`: the
// positions it holds (its prefix cache's, then those copied from the dead pool).
uint32_t ResumeFrom(GpuRig& rig, const DeviceDouble& dead, std::span<const int32_t> prompt) {
  Result<KvRegion> records = dead.Mirror();
  EXPECT_TRUE(records.ok());
  if (!records.ok()) return 0;
  const transformer::KvSource source{&*records, &dead.pool()};
  return rig.slots->Reuse(0, prompt, &source);
}

// What a reader finds of `tokens` in records: positions, in order.
uint32_t Found(const KvRegion& records, std::span<const int32_t> tokens) {
  uint32_t found = 0;
  for (const KvRegion::Extent& e : records.Longest(tokens, static_cast<uint32_t>(tokens.size()))) found += e.count;
  return found;
}

TEST(GpuKvMirrorTest, AFreshPoolsRegionHasItsHeaderAndClaimsNothing) {
  GpuRig rig(512, 2, transformer::KvPoolBlocks(512, 2));
  EXPECT_EQ(rig.device.pool().bytes, KvRegion::WholeBytes(SmallConfig().num_hidden_layers, SmallConfig().kv_size(),
                                                          rig.device.plan().blocks, KvElement::kF32))
      << "laid out as a whole region on the CPU";
  Result<KvRegion> mirror = rig.device.Mirror();
  ASSERT_TRUE(mirror.ok()) << mirror.status().ToString();
  std::vector<int32_t> held;
  EXPECT_TRUE(mirror->Records(held).empty());
  // A region of another shape is no source: its header says so.
  EXPECT_EQ(KvRegion::FromImage(std::vector<uint8_t>(64), 2, 4, rig.device.plan().blocks, KvElement::kF32)
                .status()
                .code(),
            Code::kInvalidArgument);
}

// Blocks taken from the prefix cache and written again, a shared block copied before it is
// rewritten, decodes across block boundaries: at every write into the region or its blocks the
// mirror claims only what is in place (the double checks), and once a step is done it says what
// the host's records say.
TEST(GpuKvMirrorTest, TheMirrorNeverClaimsMoreThanTheBlocksHold) {
  constexpr uint32_t kContext = 512;
  GpuRig rig(kContext, 2, transformer::KvPoolBlocks(kContext, 2, kContext));  // 8 blocks
  const std::vector<int32_t> a = Tokens(200, 1);
  rig.Step({{0, a, 0}});
  rig.slots->Free(0);  // its three full blocks stay, published, in the prefix cache
  const std::vector<int32_t> b = Tokens(450, 2);  // needs every block: a's cached ones are taken
  rig.Step({{1, std::span(b).first(256), 0}});
  rig.Step({{1, std::span(b).subspan(256), 256}});
  rig.slots->Free(1);
  // Two sequences share a prompt's blocks; one rewrites inside the second: copied first.
  const std::vector<int32_t> p = Tokens(130, 3);
  rig.Step({{0, p, 0}});
  ASSERT_EQ(rig.slots->Reuse(1, p, nullptr), 2 * transformer::kKvBlockTokens);
  const int copies = rig.device.copies;
  const std::vector<int32_t> q = Tokens(30, 4);
  rig.Step({{1, q, 100}});
  EXPECT_EQ(rig.device.copies, copies + 1);
  std::vector<int32_t> history = p;
  for (int round = 0; round < 80; ++round) {
    const auto next = static_cast<int32_t>(round * 7 % kVocab);
    const auto at = static_cast<uint32_t>(history.size());
    history.push_back(next);
    const int writes = rig.device.region_writes;
    EXPECT_EQ(rig.Step({{0, {&next, 1}, at}})[0], Digest(history));
    // A decoding sequence's record is said once a step (raised after it: lowered before, it would
    // say what it says already), in three writes.
    if (at % transformer::kKvBlockTokens != 0) {
      EXPECT_EQ(rig.device.region_writes - writes, 3) << "at " << at;
    }
  }
  EXPECT_EQ(rig.device.mirror_violations, 0);
  EXPECT_GT(rig.device.region_writes, 0);
  Result<KvRegion> mirror = rig.device.Mirror();
  ASSERT_TRUE(mirror.ok());
  EXPECT_EQ(Found(*mirror, history), Found(rig.pool->region(), history)) << "the mirror says what the host says";
  EXPECT_EQ(Found(*mirror, history), history.size());
}

// A write into the mirror that fails before a step fails the step: nothing runs, nothing commits.
TEST(GpuKvMirrorTest, AStepWhoseRecordsCannotBeWrittenRunsNot) {
  GpuRig rig(512, 2, transformer::KvPoolBlocks(512, 2));
  const std::vector<int32_t> p = Tokens(40, 5);
  rig.device.fail_writes = true;
  std::vector<float> logits(kVocab);
  std::vector<int32_t> argmax(1);
  std::vector<StepRun> runs{{0, p, 0}};
  EXPECT_EQ(rig.slots->Step(runs, logits, argmax).code(), Code::kInternal);
  EXPECT_EQ(rig.device.steps, 0);
  EXPECT_EQ(rig.first->length(), 0u);
  rig.device.fail_writes = false;
  EXPECT_EQ(rig.Step({{0, p, 0}})[0], Digest(p));
}

// A worker dies mid-stream: a new one, its own pool empty, finds the prompt and the tokens sent in
// the dead pool's mirror and copies their keys and values on the device instead of computing them;
// the stream then goes on from its own history. What it copied serves that sequence alone.
TEST(GpuKvMirrorTest, AResumedSequenceCopiesItsPositionsFromADeadPoolOnTheDevice) {
  constexpr uint32_t kContext = 512;
  GpuRig live(kContext, 2, transformer::KvPoolBlocks(kContext, 2));
  std::vector<int32_t> history = Tokens(150, 6);
  live.Step({{0, history, 0}});
  for (int round = 0; round < 20; ++round) {
    const auto next = static_cast<int32_t>(round * 13 % kVocab);
    live.Step({{0, {&next, 1}, static_cast<uint32_t>(history.size())}});
    history.push_back(next);
  }
  const DeviceDouble dead = live.device;  // the region the supervisor held when the worker died

  // The new worker's pool is small and full of an earlier prompt's published blocks: the import
  // takes some of them, whose records must claim nothing there before the copy lands.
  GpuRig resumed(kContext, 2, transformer::KvPoolBlocks(kContext, 2, kContext));  // 8 blocks
  const std::vector<int32_t> earlier = Tokens(450, 7);
  resumed.Step({{1, std::span(earlier).first(256), 0}});
  resumed.Step({{1, std::span(earlier).subspan(256), 256}});
  resumed.slots->Free(1);
  const int steps = resumed.device.steps;
  std::vector<int32_t> prompt = history;
  prompt.push_back(42);  // the next token to run: the last is never copied (its logits are wanted)
  EXPECT_EQ(ResumeFrom(resumed, dead, prompt), history.size()) << "every position sent, copied";
  EXPECT_EQ(resumed.device.steps, steps) << "none computed";
  // Two whole blocks in one copy each, the third's 42 positions a copy per layer's keys and values.
  EXPECT_EQ(resumed.device.rows_copied, 2 + 2 * uint64_t{SmallConfig().num_hidden_layers});
  EXPECT_EQ(resumed.Step({{0, std::span(prompt).last(1), static_cast<uint32_t>(history.size())}})[0],
            Digest(prompt))
      << "the copied positions hold the stream's history";
  EXPECT_EQ(resumed.slots->Reuse(1, prompt, nullptr), 0u) << "nothing copied joins the prefix cache";
  EXPECT_EQ(resumed.device.mirror_violations, 0);

  // A region of another model's shape is found by nothing: everything is computed.
  GpuRig other(kContext, 3, transformer::KvPoolBlocks(kContext, 3));
  EXPECT_FALSE(KvRegion::FromImage(dead.MirrorBytes(), SmallConfig().num_hidden_layers,
                                   SmallConfig().kv_size(), other.device.plan().blocks, KvElement::kF32)
                   .ok());
}

// A resumed sequence whose first block its new worker's prefix cache keeps already: the import
// goes on from there, the whole blocks after it a copy each.
TEST(GpuKvMirrorTest, AnImportAfterAReusedPrefixCopiesOnlyTheRest) {
  constexpr uint32_t kContext = 512;
  GpuRig live(kContext, 2, transformer::KvPoolBlocks(kContext, 2));
  const std::vector<int32_t> history = Tokens(200, 10);
  live.Step({{0, history, 0}});
  const DeviceDouble dead = live.device;
  GpuRig resumed(kContext, 2, transformer::KvPoolBlocks(kContext, 2));
  resumed.Step({{1, std::span(history).first(70), 0}});  // publishes the first block
  resumed.slots->Free(1);
  const int steps = resumed.device.steps;
  std::vector<int32_t> prompt = history;
  prompt.push_back(42);
  EXPECT_EQ(ResumeFrom(resumed, dead, prompt), history.size());
  // Blocks 1 and 2 whole, block 3's 8 positions a copy per layer's keys and values; block 0 reused.
  EXPECT_EQ(resumed.device.rows_copied, 2 + 2 * uint64_t{SmallConfig().num_hidden_layers});
  EXPECT_EQ(resumed.device.steps, steps);
  EXPECT_EQ(resumed.Step({{0, std::span(prompt).last(1), static_cast<uint32_t>(history.size())}})[0], Digest(prompt));
  EXPECT_EQ(resumed.device.mirror_violations, 0);
}

// A model parked: the worker copies its pool's region out into host memory (the blocks' keys and
// values, the records mirrored after them: a whole host region); the instance that unparks it
// writes them back into its own pool and keeps the prefix cache, so a prompt that begins as one
// before the park did takes its blocks instead of computing them.
TEST(GpuKvMirrorTest, AParkedPoolsHostCopyIsTakenOverWithItsPrefixes) {
  constexpr uint32_t kContext = 512;
  const Config c = SmallConfig();
  GpuRig parked(kContext, 2, transformer::KvPoolBlocks(kContext, 2));
  const std::vector<int32_t> prompt = Tokens(200, 8);
  parked.Step({{0, prompt, 0}});
  parked.slots->Free(0);
  const uint32_t blocks = parked.device.plan().blocks;
  Result<KvRegion> copy = KvRegion::Create(c.num_hidden_layers, c.kv_size(), blocks, KvElement::kF32);
  ASSERT_TRUE(copy.ok());
  for (uint32_t b = 0; b < blocks; ++b) {
    for (uint32_t p = 0; p < transformer::kKvBlockTokens; ++p) {
      static_cast<float*>(copy->data())[parked.device.TokenAt(b, p)] = static_cast<float>(parked.device.cell(b, p));
    }
  }
  const KvRegion::Span span = KvRegion::ImageSpan(c.num_hidden_layers, c.kv_size(), blocks, KvElement::kF32);
  ASSERT_EQ(pwrite(copy->handle(), parked.device.MirrorBytes().data(), span.bytes, static_cast<off_t>(span.offset)),
            static_cast<ssize_t>(span.bytes));
  Result<KvRegion> host =
      KvRegion::Open(copy->handle(), copy->bytes(), c.num_hidden_layers, c.kv_size(), blocks, KvElement::kF32);
  ASSERT_TRUE(host.ok()) << host.status().ToString();

  GpuRig unparked(kContext, 2, transformer::KvPoolBlocks(kContext, 2));
  Result<std::unique_ptr<transformer::KvPool>> pool = transformer::AdoptGpuPool(unparked.device, *host);
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  transformer::KvCache first(**pool, kContext);
  transformer::GpuSlots slots(unparked.device, **pool, first, 2);
  std::vector<int32_t> longer = prompt;
  longer.push_back(5);
  const uint32_t reused = slots.Reuse(1, longer, nullptr);
  EXPECT_EQ(reused, 3 * transformer::kKvBlockTokens) << "the full blocks published before the park";
  const int steps = unparked.device.steps;
  std::vector<float> logits(kVocab);
  std::vector<int32_t> argmax(1);
  std::vector<StepRun> rest{{1, std::span(longer).subspan(reused), reused}};
  ASSERT_TRUE(slots.Step(rest, logits, argmax).ok());
  EXPECT_EQ(std::max_element(logits.begin(), logits.end()) - logits.begin(), Digest(longer))
      << "the blocks hold the parked prompt's keys and values";
  EXPECT_EQ(unparked.device.steps, steps + 1);
  EXPECT_EQ(unparked.device.mirror_violations, 0);
  Result<KvRegion> mirror = unparked.device.Mirror();
  ASSERT_TRUE(mirror.ok());
  EXPECT_GE(Found(*mirror, prompt), 3 * transformer::kKvBlockTokens) << "mirrored for a death after the unpark";

  // An adopt cut short at its last write, every record but one in place on the device: the empty
  // pool that replaces it says there too that nothing is held, whatever generations they named.
  GpuRig whole(kContext, 2, transformer::KvPoolBlocks(kContext, 2));
  const int fresh_writes = whole.device.region_writes;
  ASSERT_TRUE(transformer::AdoptGpuPool(whole.device, *host).ok());
  const int adopt_writes = whole.device.region_writes - fresh_writes;
  GpuRig failed(kContext, 2, transformer::KvPoolBlocks(kContext, 2));
  failed.device.writes_before_failing = adopt_writes - 1;
  EXPECT_EQ(transformer::AdoptGpuPool(failed.device, *host).status().code(), Code::kInternal);
  Result<KvRegion> cut = failed.device.Mirror();
  ASSERT_TRUE(cut.ok());
  std::vector<int32_t> claimed;
  EXPECT_FALSE(cut->Records(claimed).empty()) << "records of the adopt stand there";
  failed.device.writes_before_failing = -1;
  ASSERT_TRUE(transformer::EmptyGpuPool(failed.device).ok());
  Result<KvRegion> after = failed.device.Mirror();
  ASSERT_TRUE(after.ok());
  std::vector<int32_t> held;
  EXPECT_TRUE(after->Records(held).empty()) << "no record claims anything";
  EXPECT_EQ(failed.device.mirror_violations, 0);

  // A pool of another size takes none of it.
  GpuRig other(kContext, 3, transformer::KvPoolBlocks(kContext, 3));
  EXPECT_EQ(transformer::AdoptGpuPool(other.device, *host).status().code(), Code::kInvalidArgument);
}

// What the worker sends when a GPU's pool parks: the pool's region copied out whole into a memfd
// sealed against resizing, which opens as a host KV region (a copy left resizable would not: a
// reader's mapping could be cut short under it). Here the region is the host backend's memory.
TEST(GpuKvMirrorTest, APoolRegionCopiedOutSealedOpensAsAHostRegion) {
  const Config c = SmallConfig();
  constexpr uint32_t kBlocks = 8;
  HostMemory memory;
  const wp_device_memory& service = *memory.service();
  wp_region region{nullptr, 0, -1};
  const uint64_t bytes = KvRegion::WholeBytes(c.num_hidden_layers, c.kv_size(), kBlocks, KvElement::kF32);
  ASSERT_EQ(service.alloc(service.ctx, bytes, &region), WP_OK);
  // A records image written into it as a GPU pool's mirror is, and a float where keys would be.
  Result<KvRegion> records = KvRegion::CreateRecords(c.num_hidden_layers, c.kv_size(), kBlocks, KvElement::kF32);
  ASSERT_TRUE(records.ok());
  const std::vector<int32_t> tokens = Tokens(transformer::kKvBlockTokens, 9);
  records->Describe({0, 1}, {transformer::KvLink::kNone, 0}, tokens);
  for (const KvRegion::ImageWrite& w : records->ImageWrites()) {
    ASSERT_EQ(service.write(service.ctx, &region, w.offset, w.bytes, w.size), WP_OK);
  }
  const float key = 42.5f;
  ASSERT_EQ(service.write(service.ctx, &region, 4 * sizeof(float), &key, sizeof(key)), WP_OK);

  Result<int> sealed = HostMemory::CopyToSealedHost(service, region);
  ASSERT_TRUE(sealed.ok()) << sealed.status().ToString();
  Result<KvRegion> host = KvRegion::Open(*sealed, bytes, c.num_hidden_layers, c.kv_size(), kBlocks, KvElement::kF32);
  ASSERT_TRUE(host.ok()) << host.status().ToString();
  EXPECT_EQ(static_cast<const float*>(host->data())[4], key);
  EXPECT_EQ(Found(*host, tokens), transformer::kKvBlockTokens) << "its records as mirrored";
  close(*sealed);

  Result<int> plain = HostMemory::CopyToHost(service, region);  // the weights' copy: never read as a pool
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(KvRegion::Open(*plain, bytes, c.num_hidden_layers, c.kv_size(), kBlocks, KvElement::kF32).status().code(),
            Code::kInvalidArgument);
  close(*plain);
  service.free(service.ctx, &region);
}

}  // namespace
}  // namespace warmpool::testing
