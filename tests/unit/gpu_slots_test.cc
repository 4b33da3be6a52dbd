// The host's half of the GPU's continuous batching (engines/transformer/gpu_slots.h), on a model
// double that stands for the device (tests/unit/gpu_device_double.h): a run answered with the
// digest of its own sequence's tokens was given a table that leads to exactly its history: blocks
// taken, shared, published, reused and copied before being rewritten, as the device would find
// them. The kernels themselves are checked on a GPU
// (transformer_gpu_test).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "engines/transformer/gpu_slots.h"
#include "engines/transformer/kv_cache.h"
#include "engines/transformer/sampler.h"
#include "tests/unit/gpu_device_double.h"

namespace warmpool::testing {
namespace {

class GpuSlotsTest : public ::testing::Test {
 protected:
  static constexpr uint32_t kContext = 512;
  static constexpr uint32_t kSequences = 3;

  void SetUp() override {
    device_ = std::make_unique<DeviceDouble>(kContext, kSequences, transformer::KvPoolBlocks(kContext, kSequences));
    Result<std::unique_ptr<transformer::KvPool>> pool = transformer::MakeGpuPool(*device_);
    ASSERT_TRUE(pool.ok()) << pool.status().ToString();
    pool_ = std::move(*pool);
    first_ = std::make_unique<transformer::KvCache>(*pool_, kContext);
    slots_ = std::make_unique<transformer::GpuSlots>(*device_, *pool_, *first_, kSequences);
  }

  // One step of these runs; returns each run's argmax (its digest), through the logits or not.
  std::vector<int32_t> Step(std::vector<transformer::SequenceSlots::Run> runs) {
    std::vector<float> logits(runs.size() * uint64_t{kVocab});
    std::vector<int32_t> argmax(runs.size(), -7);
    Status s = slots_->Step(runs, logits, argmax);
    EXPECT_TRUE(s.ok()) << s.ToString();
    for (size_t i = 0; i < runs.size(); ++i) {
      if (runs[i].argmax_only) continue;
      EXPECT_EQ(argmax[i], -1) << "a run that wants its logits gets no argmax";
      const float* row = logits.data() + i * kVocab;
      argmax[i] = static_cast<int32_t>(std::max_element(row, row + kVocab) - row);
    }
    return argmax;
  }

  std::unique_ptr<DeviceDouble> device_;
  std::unique_ptr<transformer::KvPool> pool_;
  std::unique_ptr<transformer::KvCache> first_;
  std::unique_ptr<transformer::GpuSlots> slots_;
};

TEST_F(GpuSlotsTest, ThePoolKeepsItsBookkeepingHereAndItsFloatsOnTheDevice) {
  EXPECT_FALSE(pool_->floats_here());
  EXPECT_EQ(pool_->region().data(), nullptr);
  EXPECT_EQ(pool_->blocks().count(), device_->plan().blocks);
  EXPECT_EQ(device_->plan().block_floats, pool_->region().BlockElements()) << "one layout on both sides";
}

// Prompts of three sequences and their decodes, together in steps: each run finds its own history.
TEST_F(GpuSlotsTest, SequencesSteppedTogetherEachFindTheirOwnHistory) {
  std::vector<std::vector<int32_t>> history{Tokens(70, 1), Tokens(5, 2), Tokens(140, 3)};
  std::vector<int32_t> got = Step({{0, history[0], 0}, {1, history[1], 0, true}, {2, history[2], 0}});
  for (uint32_t s = 0; s < kSequences; ++s) EXPECT_EQ(got[s], Digest(history[s])) << "sequence " << s;
  for (int round = 0; round < 70; ++round) {  // across block boundaries for each
    std::vector<transformer::SequenceSlots::Run> runs;
    std::vector<int32_t> next(kSequences);
    for (uint32_t s = 0; s < kSequences; ++s) {
      next[s] = static_cast<int32_t>((round * 31 + s * 17) % kVocab);
      runs.push_back({s, {&next[s], 1}, static_cast<uint32_t>(history[s].size()), s == 1});
    }
    got = Step(runs);
    for (uint32_t s = 0; s < kSequences; ++s) {
      history[s].push_back(next[s]);
      ASSERT_EQ(got[s], Digest(history[s])) << "sequence " << s << ", round " << round;
    }
  }
  EXPECT_TRUE(pool_->blocks().Consistent());
}

// A prompt's full blocks published by one sequence are what the next, with the same beginning,
// reads instead of computing: the device finds them through its table.
TEST_F(GpuSlotsTest, ALaterSequenceReadsThePublishedPrefixThroughItsTable) {
  const std::vector<int32_t> prompt = Tokens(150, 4);
  Step({{0, prompt, 0}});
  slots_->Free(0);
  std::vector<int32_t> longer = prompt;
  longer.insert(longer.end(), {11, 12, 13});
  const uint32_t reused = slots_->Reuse(1, longer, nullptr);
  EXPECT_EQ(reused, 2 * kKvBlockTokens) << "two full blocks kept";
  const int steps = device_->steps;
  std::vector<int32_t> rest(longer.begin() + reused, longer.end());
  EXPECT_EQ(Step({{1, rest, reused}})[0], Digest(longer));
  EXPECT_EQ(device_->steps, steps + 1) << "the prefix is not computed again";
}

// Two sequences hold the same prefix blocks; one rewrites its first positions. Its blocks are
// copied on the device before being written, and the other still reads its own history.
TEST_F(GpuSlotsTest, ASharedBlockIsCopiedOnTheDeviceBeforeItIsRewritten) {
  const std::vector<int32_t> prompt = Tokens(130, 5);
  Step({{0, prompt, 0}});
  ASSERT_EQ(slots_->Reuse(1, prompt, nullptr), 2 * kKvBlockTokens);
  ASSERT_EQ(slots_->Reuse(2, prompt, nullptr), 2 * kKvBlockTokens);
  const std::vector<int32_t> other = Tokens(10, 6);
  const int copies = device_->copies;
  EXPECT_EQ(Step({{2, other, 0}})[0], Digest(other));
  EXPECT_EQ(device_->copies, copies + 1) << "the shared first block, copied once";
  std::vector<int32_t> tail(prompt.begin() + 2 * kKvBlockTokens, prompt.end());
  EXPECT_EQ(Step({{1, tail, 2 * kKvBlockTokens}})[0], Digest(prompt)) << "the other holder's history is intact";
  EXPECT_TRUE(pool_->blocks().Consistent());
}

// A bad token or a run past the context is refused before any cache forgets a position.
TEST_F(GpuSlotsTest, ABadStepChangesNoCache) {
  const std::vector<int32_t> prompt = Tokens(40, 7);
  Step({{0, prompt, 0}});
  const int32_t outside = kVocab;
  std::vector<float> logits(2 * uint64_t{kVocab});
  std::vector<int32_t> argmax(2);
  const std::vector<int32_t> again(prompt.begin(), prompt.begin() + 5);
  std::vector<transformer::SequenceSlots::Run> bad{{0, again, 0}, {1, {&outside, 1}, 0}};
  EXPECT_EQ(slots_->Step(bad, logits, argmax).code(), Code::kInvalidArgument);
  EXPECT_EQ(first_->length(), 40u) << "slot 0 keeps its positions";
  const int32_t one = 3;
  bad = {{1, {&one, 1}, kContext}};
  EXPECT_EQ(slots_->Step(bad, logits, argmax).code(), Code::kInvalidArgument) << "past the context";
  bad = {{0, {&one, 1}, 40}, {0, {&one, 1}, 41}};
  EXPECT_EQ(slots_->Step(bad, logits, argmax).code(), Code::kInvalidArgument) << "a slot twice";
  const int32_t next = 9;
  std::vector<int32_t> history = prompt;
  history.push_back(next);
  EXPECT_EQ(Step({{0, {&next, 1}, 40}})[0], Digest(history));
}

// One sequence's forward passes (embeddings, typed runs): a prompt longer than a step goes in
// pieces no larger than the plan's rows, and the last piece's result comes back.
TEST_F(GpuSlotsTest, ASequencesLongPromptGoesInPiecesOfAStep) {
  transformer::GpuSequence sequence(*device_, *first_);
  const std::vector<int32_t> prompt = Tokens(kContext - 2, 8);
  std::vector<float> logits(kVocab);
  ASSERT_TRUE(sequence.Forward(prompt, 0, logits).ok());
  EXPECT_EQ(std::max_element(logits.begin(), logits.end()) - logits.begin(), Digest(prompt));
  EXPECT_GE(device_->steps, 2) << "more than one step's rows";
  std::vector<int32_t> history = prompt;
  history.push_back(17);
  Result<int32_t> chosen = sequence.ForwardArgMax({&history.back(), 1}, kContext - 2);
  ASSERT_TRUE(chosen.ok());
  EXPECT_EQ(*chosen, Digest(history));
  std::vector<float> hidden(SmallConfig().hidden_size);
  ASSERT_TRUE(sequence.Hidden(history, 0, hidden).ok());
  EXPECT_EQ(hidden[0], static_cast<float>(Digest(history)));
  EXPECT_EQ(sequence.Forward(history, 2, logits).code(), Code::kInvalidArgument) << "past the context";
  EXPECT_EQ(sequence.Forward({}, 0, logits).code(), Code::kInvalidArgument) << "no tokens";
}

// Greedy decoding whose argmax the device could not find (every logit NaN or -inf): the run's
// logits, not copied back, say so as well, so that its sequence fails as on the CPU instead of
// choosing token 0 from a row of zeros.
TEST_F(GpuSlotsTest, AnArgmaxTheDeviceCannotFindLeavesLogitsThatAreNoNumbers) {
  const std::vector<int32_t> fine = Tokens(3, 9);
  const std::vector<int32_t> broken{1, 2, DeviceDouble::kBroken};
  std::vector<transformer::SequenceSlots::Run> runs{{0, fine, 0, true}, {1, broken, 0, true}};
  std::vector<float> logits(2 * uint64_t{kVocab}, 0.0f);
  std::vector<int32_t> argmax(2, -7);
  ASSERT_TRUE(slots_->Step(runs, logits, argmax).ok());
  EXPECT_EQ(argmax[0], Digest(fine));
  EXPECT_EQ(argmax[1], -1);
  EXPECT_TRUE(std::all_of(logits.begin() + kVocab, logits.end(), [](float x) { return std::isnan(x); }));
  EXPECT_FALSE(transformer::ArgMaxToken({logits.data() + kVocab, kVocab}).ok()) << "the sequence fails";
}

// A step that fails on the device, or a shared block whose copy cannot be made, commits nothing:
// each cache holds what it held before the run's start, and the same step then runs.
TEST_F(GpuSlotsTest, AFailedStepOrCopyCommitsNothing) {
  const std::vector<int32_t> prompt = Tokens(130, 10);
  Step({{0, prompt, 0}});
  ASSERT_EQ(slots_->Reuse(1, prompt, nullptr), 2 * kKvBlockTokens);
  const int32_t next = 5;
  std::vector<float> logits(uint64_t{kVocab});
  std::vector<int32_t> argmax(1);
  device_->fail_steps = true;
  std::vector<transformer::SequenceSlots::Run> runs{{0, {&next, 1}, 130}};
  EXPECT_EQ(slots_->Step(runs, logits, argmax).code(), Code::kInternal);
  EXPECT_EQ(first_->length(), 130u) << "nothing committed";
  device_->fail_steps = false;
  std::vector<int32_t> history = prompt;
  history.push_back(next);
  EXPECT_EQ(Step({{0, {&next, 1}, 130}})[0], Digest(history));

  // Slot 1 rewrites a block it shares with slot 0: the copy fails, and the shared block stays its.
  device_->fail_copies = true;
  runs = {{1, {prompt.data() + 100, 30}, 100}};
  EXPECT_EQ(slots_->Step(runs, logits, argmax).code(), Code::kInternal);
  device_->fail_copies = false;
  EXPECT_EQ(Step({{1, {prompt.data() + 100, 30}, 100}})[0], Digest(prompt)) << "copied now, and intact";
  EXPECT_EQ(Step({{0, {&next, 1}, 131}})[0], Digest([&] {
              history.push_back(next);
              return history;
            }())) << "slot 0's blocks untouched";
  EXPECT_TRUE(pool_->blocks().Consistent());
}

// A pool too small for two prompts at once: the second run's cache finds no block, and the step
// commits neither; the first then runs alone.
TEST(GpuSlotsPoolTest, APoolWithNoBlockLeftFailsTheStepAndCommitsNeither) {
  constexpr uint32_t kContext = 512;
  DeviceDouble device(kContext, 2, transformer::KvPoolBlocks(kContext, 2, kContext));
  Result<std::unique_ptr<transformer::KvPool>> pool = transformer::MakeGpuPool(device);
  ASSERT_TRUE(pool.ok());
  transformer::KvCache first(**pool, kContext);
  transformer::GpuSlots slots(device, **pool, first, 2);
  const std::vector<int32_t> a = Tokens(200, 11), b = Tokens(130, 12), a_rest = Tokens(60, 13),
                             b_rest = Tokens(70, 14);
  std::vector<float> logits(2 * uint64_t{kVocab});
  std::vector<int32_t> argmax(2);
  std::vector<transformer::SequenceSlots::Run> runs{{0, a, 0}};
  ASSERT_TRUE(slots.Step(runs, logits, argmax).ok());
  runs = {{1, b, 0}};
  ASSERT_TRUE(slots.Step(runs, logits, argmax).ok());  // 4 and 3 blocks of the pool's 8
  runs = {{0, a_rest, 200}, {1, b_rest, 130}};           // a fifth block each
  EXPECT_EQ(slots.Step(runs, logits, argmax).code(), Code::kResourceExhausted);
  EXPECT_EQ(device.steps, 2);
  EXPECT_EQ(first.length(), 200u);
  runs = {{0, a_rest, 200}};
  std::vector<int32_t> history = a;
  history.insert(history.end(), a_rest.begin(), a_rest.end());
  EXPECT_TRUE(slots.Step(runs, logits, argmax).ok());
  EXPECT_EQ(std::max_element(logits.begin(), logits.begin() + kVocab) - logits.begin(), Digest(history));
}

}  // namespace
}  // namespace warmpool::testing
