// Preemption (engine ABI version 13): where the KV pool is smaller than every sequence's whole
// context, a preemptible generation is admitted by its prompt and first token, its reservation
// grows with its positions, and when a step cannot be covered the preemptible sequences whose
// requests arrived last (or, where the caller does not say, the youngest) give way: ended before
// their end, their blocks freed, saying what they need to go on. One resumed after the tokens it
// had emitted then generates what it would have undisturbed. A generation that is not preemptible
// is admitted by all it may need, as in version 12, and never gives way.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "engines/transformer/kv_cache.h"
#include "tests/unit/transformer_engine_fixture.h"

namespace warmpool::transformer {
namespace {

constexpr uint32_t kContext = 256;  // four blocks

class TransformerPreemptTest : public TransformerEngineTest {
 protected:
  struct Stepped {
    std::map<wp_sequence*, std::vector<int32_t>> tokens;  // what each emitted
    std::vector<wp_sequence*> preempted;                   // in the order they gave way
    std::map<wp_sequence*, uint32_t> needs;                // what each preempted one needs to go on
  };
  // Steps the sequences together until each has ended, closing it; every step checked: a sequence
  // ends well, or preempted (and then nothing of that step was emitted for it).
  static void RunToTheirEnds(Engine& engine, std::vector<wp_sequence*> open, Stepped& out) {
    for (int steps = 0; !open.empty() && steps < 4000; ++steps) {
      std::vector<wp_sequence_step> step;
      for (wp_sequence* s : open) step.push_back(wp_sequence_step{s, 0, WP_OK, {}, {}, 0});
      std::vector<size_t> emitted(open.size(), 0);
      Status s = engine.Step(step, [&](uint32_t i, std::string_view, std::span<const int32_t> t,
                                       std::span<const wp_token_logprobs>) {
        out.tokens[open[i]].insert(out.tokens[open[i]].end(), t.begin(), t.end());
        emitted[i] += t.size();
      });
      ASSERT_TRUE(s.ok()) << s.ToString();
      std::optional<Engine::KvCacheUsage> usage = engine.KvUsage();
      ASSERT_TRUE(usage.has_value());
      EXPECT_LE(usage->reserved, usage->blocks) << "never more spoken for than the pool has";
      EXPECT_LE(usage->held, usage->reserved) << "nothing held that is not spoken for";
      for (size_t i = step.size(); i-- > 0;) {
        if (step[i].ended == 0) continue;
        const uint32_t need = engine.PreemptedBlocks(open[i]);
        if (need != 0) {
          EXPECT_EQ(step[i].status, WP_RESOURCE_EXHAUSTED);
          EXPECT_NE(std::string(step[i].error).find("preempted"), std::string::npos) << step[i].error;
          EXPECT_EQ(emitted[i], 0u) << "nothing emitted in the step that preempted it";
          out.preempted.push_back(open[i]);
          out.needs[open[i]] = need;
        } else {
          EXPECT_EQ(step[i].status, WP_OK) << step[i].error;
        }
        engine.CloseSequence(open[i]);
        open.erase(open.begin() + static_cast<ptrdiff_t>(i));
      }
    }
    EXPECT_TRUE(open.empty());
  }
  static wp_generate_request Preemptible(std::string_view prompt, uint32_t max_tokens) {
    wp_generate_request r = Greedy(prompt, max_tokens);
    r.preemptible = 1;
    return r;
  }
};

TEST_F(TransformerPreemptTest, TheYoungestGiveWayAndOneResumedGeneratesWhatItWouldHave) {
  Result<Engine> engine = LoadDirectory(kContext, 4, kContext);  // four blocks for four sequences
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  const std::string prompts[] = {"This program is free software", "you can redistribute it",
                                 "GNU General Public License", "WITHOUT ANY WARRANTY"};
  constexpr uint32_t kTokens = 150;  // three blocks each: four of them cannot all go on
  std::vector<wp_sequence*> open;
  for (const std::string& p : prompts) {
    Result<wp_sequence*> s = engine->OpenSequence(Preemptible(p, kTokens));
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    open.push_back(*s);
  }
  EXPECT_EQ(engine->KvUsage()->reserved, 4u) << "each admitted by its prompt's block";
  Stepped stepped;
  RunToTheirEnds(*engine, open, stepped);
  ASSERT_FALSE(stepped.preempted.empty());
  // The youngest gave way first; the oldest never did, and generated what it does alone.
  for (size_t i = 0; i + 1 < stepped.preempted.size(); ++i) {
    const auto at = [&](wp_sequence* s) { return std::find(open.begin(), open.end(), s) - open.begin(); };
    EXPECT_GT(at(stepped.preempted[i]), at(stepped.preempted[i + 1]));
  }
  EXPECT_EQ(std::find(stepped.preempted.begin(), stepped.preempted.end(), open[0]), stepped.preempted.end());
  EXPECT_EQ(stepped.tokens[open[0]], Reference(prompts[0], kTokens));
  EXPECT_EQ(engine->KvUsage()->reserved, 0u);
  EXPECT_EQ(engine->KvUsage()->held, 0u);

  // Each preempted one, opened again after the tokens it emitted, ends as it would have alone.
  for (wp_sequence* gone : stepped.preempted) {
    const size_t index = std::find(open.begin(), open.end(), gone) - open.begin();
    const std::vector<int32_t> sent = stepped.tokens[gone];
    wp_generate_request again = Preemptible(prompts[index], kTokens);
    again.resume_tokens = sent.data();
    again.resume_count = static_cast<uint32_t>(sent.size());
    Result<wp_sequence*> resumed = engine->OpenSequence(again);
    ASSERT_TRUE(resumed.ok()) << resumed.status().ToString();
    EXPECT_EQ(engine->KvUsage()->reserved, stepped.needs[gone]) << "what it said it needed to go on";
    Stepped rest;
    RunToTheirEnds(*engine, {*resumed}, rest);
    std::vector<int32_t> all = sent;
    all.insert(all.end(), rest.tokens[*resumed].begin(), rest.tokens[*resumed].end());
    EXPECT_EQ(all, Reference(prompts[index], kTokens)) << "sequence " << index;
  }
}

TEST_F(TransformerPreemptTest, AGenerationThatIsNotPreemptibleIsAdmittedByAllItMayNeedAndNeverGivesWay) {
  Result<Engine> engine = LoadDirectory(kContext, 4, kContext);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  // The youngest, but not preemptible: its three blocks are spoken for from the start.
  Result<wp_sequence*> old = engine->OpenSequence(Preemptible("This program is free software", 150));
  ASSERT_TRUE(old.ok());
  Result<wp_sequence*> fixed = engine->OpenSequence(Greedy("you can redistribute it", 150));
  ASSERT_TRUE(fixed.ok()) << fixed.status().ToString();
  EXPECT_EQ(engine->KvUsage()->reserved, 4u);
  Stepped stepped;
  RunToTheirEnds(*engine, {*old, *fixed}, stepped);
  ASSERT_EQ(stepped.preempted.size(), 1u);
  EXPECT_EQ(stepped.preempted[0], *old) << "the preemptible one gives way, older though it is";
  EXPECT_EQ(stepped.tokens[*fixed], Reference("you can redistribute it", 150));
}

TEST_F(TransformerPreemptTest, WithEverySequencesWholeContextNothingIsPreempted) {
  Result<Engine> engine = LoadDirectory(kContext, 2, 0);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  Result<wp_sequence*> a = engine->OpenSequence(Preemptible("This program is free software", 150));
  Result<wp_sequence*> b = engine->OpenSequence(Preemptible("you can redistribute it", 150));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(engine->KvUsage()->reserved, 6u) << "admitted by all they may need: no sharing to make room in";
  Stepped stepped;
  RunToTheirEnds(*engine, {*a, *b}, stepped);
  EXPECT_TRUE(stepped.preempted.empty());
}

// The caller's order of arrival, not the order of opening, says who gives way: one resumed after a
// preemption opens after the others but keeps its place among them.
TEST_F(TransformerPreemptTest, TheLatestToArriveGivesWayWhateverOpenedFirst) {
  Result<Engine> engine = LoadDirectory(kContext, 2, kContext);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  wp_generate_request late = Preemptible("This program is free software", 150);
  late.arrival = 20;
  wp_generate_request early = Preemptible("you can redistribute it", 150);
  early.arrival = 10;  // a resumed one, say: opened second, arrived first
  Result<wp_sequence*> a = engine->OpenSequence(late);
  Result<wp_sequence*> b = engine->OpenSequence(early);
  ASSERT_TRUE(a.ok() && b.ok());
  Stepped stepped;
  RunToTheirEnds(*engine, {*a, *b}, stepped);
  ASSERT_FALSE(stepped.preempted.empty());
  EXPECT_EQ(stepped.preempted[0], *a) << "the later arrival gave way, though it opened first";
  EXPECT_EQ(stepped.tokens[*b], Reference("you can redistribute it", 150));
}

// Prompts that share a published prefix and go in pieces beside the decoding ones (chunked
// prefill), preempted as they grow: every step keeps within the pool, and every generation — run
// through, or preempted and resumed after what it emitted — ends as it does alone.
TEST_F(TransformerPreemptTest, SharedPrefixesAndPromptsInPiecesKeepWithinThePool) {
  Result<Engine> engine = LoadDirectory(kContext, 4, 2 * kContext);  // eight blocks: two each at first
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  std::string prefix;
  for (int i = 0; i < 8; ++i) prefix += "This program is free software; ";
  const std::vector<std::string> prompts{prefix + "you can", prefix + "and", prefix + "WITHOUT", prefix + "GNU"};
  constexpr uint32_t kTokens = 120;
  uint32_t prompt_tokens = 0;
  Result<wp_sequence*> first = engine->OpenSequence(Preemptible(prompts[0], kTokens), &prompt_tokens);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_GT(prompt_tokens, kKvBlockTokens) << "a whole block of prefix to publish";
  Stepped stepped;
  std::vector<wp_sequence_step> one{wp_sequence_step{*first, 0, WP_OK, {}, {}, 0}};
  ASSERT_TRUE(engine->Step(one, [&](uint32_t, std::string_view, std::span<const int32_t> t,
                                    std::span<const wp_token_logprobs>) {
    stepped.tokens[*first].insert(stepped.tokens[*first].end(), t.begin(), t.end());
  }).ok());  // its prompt, whole, and its first token
  std::vector<wp_sequence*> open{*first};
  for (size_t i = 1; i < prompts.size(); ++i) {
    Result<wp_sequence*> s = engine->OpenSequence(Preemptible(prompts[i], kTokens));
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    open.push_back(*s);
  }
  EXPECT_EQ(engine->KvUsage()->held, 2u) << "the first's two blocks, its first shared by the others";
  RunToTheirEnds(*engine, open, stepped);
  ASSERT_FALSE(stepped.preempted.empty());
  for (size_t i = 0; i < open.size(); ++i) {
    std::vector<int32_t> all = stepped.tokens[open[i]];
    if (std::find(stepped.preempted.begin(), stepped.preempted.end(), open[i]) != stepped.preempted.end()) {
      wp_generate_request again = Preemptible(prompts[i], kTokens);
      const std::vector<int32_t> sent = all;
      again.resume_tokens = sent.data();
      again.resume_count = static_cast<uint32_t>(sent.size());
      Result<wp_sequence*> resumed = engine->OpenSequence(again);
      ASSERT_TRUE(resumed.ok()) << resumed.status().ToString();
      Stepped rest;
      RunToTheirEnds(*engine, {*resumed}, rest);
      all.insert(all.end(), rest.tokens[*resumed].begin(), rest.tokens[*resumed].end());
    }
    EXPECT_EQ(all, Reference(prompts[i], kTokens)) << "sequence " << i;
  }
}

}  // namespace
}  // namespace warmpool::transformer
