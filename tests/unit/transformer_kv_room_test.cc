// A KV cache of fewer positions than every sequence's whole context (engine ABI version 12's
// spec.kv_tokens): sized in whole blocks, at least one context and at most all of them; a
// generation opened only while the cache has the blocks it may come to need (its prompt and
// max_tokens, up to the context) beside those the open ones may, refused otherwise and opened once
// one closes; and the sequences it admits never find the pool empty, however far they run.
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "engines/transformer/kv_cache.h"
#include "engines/transformer/packed_model.h"
#include "tests/unit/transformer_engine_fixture.h"

namespace warmpool::transformer {
namespace {

constexpr uint32_t kContext = 256;  // four blocks

class TransformerKvRoomTest : public TransformerEngineTest {
 protected:
  Result<Engine> Loaded(uint32_t sequences, uint64_t kv_tokens) { return LoadDirectory(kContext, sequences, kv_tokens); }
  // Steps the sequences together until each has ended (closing it), every step's status checked.
  static void RunToTheirEnds(Engine& engine, std::vector<wp_sequence*> open) {
    for (int steps = 0; !open.empty() && steps < 2000; ++steps) {
      std::vector<wp_sequence_step> step;
      for (wp_sequence* s : open) step.push_back(wp_sequence_step{s, 0, WP_OK, {}, {}, 0});
      Status s = engine.Step(step, [](uint32_t, std::string_view, std::span<const int32_t>,
                                      std::span<const wp_token_logprobs>) {});
      ASSERT_TRUE(s.ok()) << s.ToString();
      for (size_t i = step.size(); i-- > 0;) {
        if (step[i].ended == 0) continue;
        EXPECT_EQ(step[i].status, WP_OK) << step[i].error;
        engine.CloseSequence(open[i]);
        open.erase(open.begin() + static_cast<ptrdiff_t>(i));
      }
    }
    EXPECT_TRUE(open.empty());
  }
};

TEST_F(TransformerKvRoomTest, TheCacheHoldsThePositionsAskedForInWholeBlocksAtLeastOneContext) {
  struct Case {
    uint64_t asked;
    uint64_t held;
  } cases[] = {{0, 4 * kContext}, {300, 320}, {10, kContext}, {kContext + 1, kContext + 64}, {100000, 4 * kContext}};
  for (const Case& c : cases) {
    Result<Engine> engine = Loaded(4, c.asked);
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    EXPECT_EQ(engine->info().kv_tokens, c.held) << "asked " << c.asked;
    std::optional<Engine::KvCacheUsage> usage = engine->KvUsage();
    ASSERT_TRUE(usage.has_value());
    EXPECT_EQ(usage->blocks * kKvBlockTokens, c.held) << "asked " << c.asked;
    EXPECT_EQ(usage->reserved, 0u);
    // The workspace counts the cache as kept: each block fewer, a block's bytes fewer.
    Result<Engine> whole = Loaded(4, 0);
    ASSERT_TRUE(whole.ok());
    EXPECT_EQ(whole->info().workspace_bytes - engine->info().workspace_bytes,
              (4 * kContext - c.held) * whole->info().kv_bytes_per_token)
        << "asked " << c.asked;
  }
}

TEST_F(TransformerKvRoomTest, AGenerationIsOpenedOnlyWhileTheBlocksItMayNeedAreFree) {
  Result<Engine> engine = Loaded(4, kContext);  // four blocks for four sequences
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  uint32_t prompt_tokens = 0;
  // A prompt of a few tokens and 100 more: two blocks each.
  Result<wp_sequence*> a = engine->OpenSequence(Greedy("This program is free software", 100), &prompt_tokens);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_LE(prompt_tokens + 99, 2 * kKvBlockTokens);
  ASSERT_GT(prompt_tokens + 99, kKvBlockTokens);
  EXPECT_EQ(engine->KvUsage()->reserved, 2u);
  Result<wp_sequence*> b = engine->OpenSequence(Greedy("you can redistribute it", 100));
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(engine->KvUsage()->reserved, 4u);

  // One block more is one too many: refused, saying why, and what it would have needed.
  Result<wp_sequence*> c = engine->OpenSequence(Greedy("GNU General Public License", 10));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), Code::kResourceExhausted);
  EXPECT_NE(c.status().message().find("may need 1"), std::string::npos) << c.status().message();
  EXPECT_EQ(engine->KvRefusedBlocks(), 1u);
  EXPECT_EQ(engine->KvUsage()->reserved, 4u);  // the refusal took nothing
  // A refusal of another kind is not named one for room: it is the request's answer.
  wp_generate_request outside = Greedy("", 10);
  const int32_t no_token = -1;
  outside.tokens = &no_token;
  outside.token_count = 1;
  Result<wp_sequence*> bad = engine->OpenSequence(outside);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(engine->KvRefusedBlocks(), 0u);

  // Once one closes, it opens; a generation of the whole context waits for all of them.
  engine->CloseSequence(*a);
  EXPECT_EQ(engine->KvUsage()->reserved, 2u);
  c = engine->OpenSequence(Greedy("GNU General Public License", 10));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(engine->KvRefusedBlocks(), 0u) << "an open says nothing of an earlier refusal";
  Result<wp_sequence*> whole = engine->OpenSequence(Greedy("WITHOUT ANY WARRANTY", 0));
  ASSERT_FALSE(whole.ok());
  EXPECT_EQ(engine->KvRefusedBlocks(), 4u);
  RunToTheirEnds(*engine, {*b, *c});
  EXPECT_EQ(engine->KvUsage()->reserved, 0u);
  EXPECT_EQ(engine->KvUsage()->held, 0u);
  whole = engine->OpenSequence(Greedy("WITHOUT ANY WARRANTY", 0));
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  RunToTheirEnds(*engine, {*whole});
}

TEST_F(TransformerKvRoomTest, SequencesAdmittedRunToTheirLimitsWithoutRunningThePoolOut) {
  // Six blocks: a whole context and two more. A prompt of more than a block runs first, so that
  // its first block is in the prefix cache; three sequences that begin as it did then hold that
  // block together, and write their own after it, up to the positions they reserved.
  Result<Engine> engine = Loaded(4, kContext + 2 * kKvBlockTokens);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  std::string prefix;
  for (int i = 0; i < 10; ++i) prefix += "This program is free software; ";
  const std::string prompts[] = {prefix + "you can", prefix + "and", prefix + "WITHOUT"};
  uint32_t prompt_tokens = 0;
  Result<wp_sequence*> first = engine->OpenSequence(Greedy(prompts[0], 1), &prompt_tokens);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_GT(prompt_tokens, kKvBlockTokens);
  ASSERT_LT(prompt_tokens + 30, 2 * kKvBlockTokens);
  RunToTheirEnds(*engine, {*first});
  std::vector<wp_sequence*> open;
  for (const std::string& p : prompts) {  // two blocks each: the shared one and their own
    Result<wp_sequence*> s = engine->OpenSequence(Greedy(p, 30));
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    open.push_back(*s);
  }
  EXPECT_EQ(engine->KvUsage()->reserved, 6u) << "each counts the block it shares";
  EXPECT_EQ(engine->KvUsage()->held, 1u) << "the prefix's block, held by all three";
  EXPECT_FALSE(engine->OpenSequence(Greedy("x", 1)).ok()) << "all six spoken for";
  RunToTheirEnds(*engine, open);
  EXPECT_EQ(engine->KvUsage()->reserved, 0u);
}

}  // namespace
}  // namespace warmpool::transformer
