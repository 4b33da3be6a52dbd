// A generation resumed after its worker died (engine ABI version 9: request.resume_tokens): given
// the tokens its client already has, the engine goes on after them and sends exactly what the
// uninterrupted generation sent after them — the same tokens, the same text, no piece twice and
// none missing — greedy or seeded, across a stop string and a character whose bytes span tokens,
// and one resumed at its very end ends at once. Tokens that could not have been generated (outside
// the vocabulary, an end token, more than max_tokens or the context) are refused.
#include <sys/mman.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/unit/transformer_engine_fixture.h"

namespace warmpool::transformer {
namespace {

class TransformerResumeTest : public TransformerEngineTest {
 protected:
  TransformerResumeTest() { spec_.dtype = safetensors::DType::F32; }

  Result<Engine> Loaded() {
    Result<Engine> engine = OpenDirectory();
    if (engine.ok()) {
      if (Status s = engine->Load(); !s.ok()) return s;
    }
    return engine;
  }
  // The uninterrupted generation, chunk by chunk: each token and the text sent with it.
  struct Chunk {
    std::vector<int32_t> tokens;
    std::string text;
  };
  static std::vector<Chunk> Chunks(Engine& engine, const wp_generate_request& request, wp_generate_result* result) {
    std::vector<Chunk> chunks;
    Result<wp_generate_result> r =
        engine.Generate(request, [&](std::string_view text, std::span<const int32_t> t, std::span<const wp_token_logprobs>) {
          if (!t.empty() || !text.empty()) chunks.push_back({{t.begin(), t.end()}, std::string(text)});
          return true;
        });
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (r.ok()) *result = *r;
    return chunks;
  }
  // An open sequence stepped alone to its end (at most 100 steps), then closed: its tokens, and how
  // many prompt tokens its first step found cached.
  struct Stepped {
    std::vector<int32_t> tokens;
    uint32_t cached = 0;
  };
  static Stepped StepToEnd(Engine& engine, wp_sequence* sequence) {
    Stepped out;
    wp_sequence_step step{sequence, 0, WP_OK, {}, {}, 0};
    for (int steps = 0; step.ended == 0 && steps < 100; ++steps) {
      const Status s = engine.Step({&step, 1}, [&](uint32_t, std::string_view, std::span<const int32_t> t,
                                                   std::span<const wp_token_logprobs>) {
        out.tokens.insert(out.tokens.end(), t.begin(), t.end());
      });
      EXPECT_TRUE(s.ok()) << s.ToString();
      if (!s.ok()) break;
      if (steps == 0) out.cached = step.cached_tokens;
    }
    engine.CloseSequence(sequence);
    return out;
  }
};

TEST_F(TransformerResumeTest, AResumedGenerationSendsExactlyWhatFollowedWhereItWasCut) {
  Result<Engine> engine = Loaded();
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  wp_generate_request greedy = Greedy("This program is free software", 24);
  wp_generate_request sampled = greedy;
  sampled.set = WP_SET_TEMPERATURE | WP_SET_SEED | WP_SET_TOP_K;
  sampled.temperature = 1.1f;
  sampled.seed = 99;
  sampled.top_k = 50;
  wp_generate_request stopped = sampled;  // a stop string the sampled text meets
  const wp_string stop{"e", 1};
  stopped.stop = &stop;
  stopped.stop_count = 1;
  int checked = 0;
  for (const wp_generate_request& request : {greedy, sampled, stopped}) {
    wp_generate_result whole{};
    const std::vector<Chunk> chunks = Chunks(*engine, request, &whole);
    ASSERT_FALSE(chunks.empty());
    for (size_t cut = 1; cut <= chunks.size(); ++cut) {
      SCOPED_TRACE(::testing::Message() << "seed " << request.seed << " stops " << request.stop_count << " cut after "
                                      << cut << " of " << chunks.size() << " chunks");
      std::vector<int32_t> sent;
      std::string rest_text;
      std::vector<int32_t> rest_tokens;
      for (size_t i = 0; i < chunks.size(); ++i) {
        std::vector<int32_t>& to = i < cut ? sent : rest_tokens;
        to.insert(to.end(), chunks[i].tokens.begin(), chunks[i].tokens.end());
        if (i >= cut) rest_text += chunks[i].text;
      }
      wp_generate_request resumed = request;
      resumed.resume_tokens = sent.data();
      resumed.resume_count = static_cast<uint32_t>(sent.size());
      Result<Output> out = Run(*engine, resumed);
      ASSERT_TRUE(out.ok()) << out.status().ToString();
      EXPECT_EQ(out->tokens, rest_tokens);
      EXPECT_EQ(out->text, rest_text);
      EXPECT_EQ(out->result.finish_reason, whole.finish_reason);
      EXPECT_EQ(out->result.completion_tokens, whole.completion_tokens) << "the resumed tokens count";
      EXPECT_EQ(out->result.prompt_tokens, whole.prompt_tokens);
      checked++;
    }
  }
  EXPECT_GT(checked, 20);
}

// A chunk's text never splits a character: a token that ends with half of one sends nothing, and
// the next sends the whole character. Cut between them, the resumed generation holds the half
// again and sends the character whole.
TEST_F(TransformerResumeTest, AResumeBetweenACharactersBytesSendsTheCharacterWhole) {
  Result<Engine> engine = Loaded();
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  Result<ModelDirectory> files = ModelDirectory::Open(dir_.path());
  ASSERT_TRUE(files.ok());
  // Sampling at a high temperature reaches the byte tokens: find a seed whose text holds back a
  // token's bytes at least once (a chunk with a token and no text).
  for (uint64_t seed = 1; seed < 200; ++seed) {
    wp_generate_request r = Greedy("This program", 40);
    r.set = WP_SET_TEMPERATURE | WP_SET_SEED;
    r.temperature = 3.0f;
    r.seed = seed;
    wp_generate_result whole{};
    const std::vector<Chunk> chunks = Chunks(*engine, r, &whole);
    for (size_t i = 0; i + 1 < chunks.size(); ++i) {
      if (!chunks[i].text.empty() || chunks[i].tokens.empty()) continue;
      std::vector<int32_t> sent;
      for (size_t j = 0; j <= i; ++j) sent.insert(sent.end(), chunks[j].tokens.begin(), chunks[j].tokens.end());
      std::string rest;
      for (size_t j = i + 1; j < chunks.size(); ++j) rest += chunks[j].text;
      r.resume_tokens = sent.data();
      r.resume_count = static_cast<uint32_t>(sent.size());
      Result<Output> out = Run(*engine, r);
      ASSERT_TRUE(out.ok()) << out.status().ToString();
      EXPECT_EQ(out->text, rest) << "seed " << seed << ", cut after chunk " << i;
      return;
    }
  }
  GTEST_SKIP() << "no seed held a character's bytes back";
}

TEST_F(TransformerResumeTest, TokensThatCouldNotHaveBeenGeneratedAreRefused) {
  Result<Engine> engine = Loaded();
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  Result<ModelDirectory> files = ModelDirectory::Open(dir_.path());
  ASSERT_TRUE(files.ok());
  const int32_t vocab = static_cast<int32_t>(files->checkpoint->config().vocab_size);
  wp_generate_request r = Greedy("This program", 8);
  for (const std::vector<int32_t>& bad : {std::vector<int32_t>{5, vocab}, std::vector<int32_t>{-1},
                                          std::vector<int32_t>{files->end_tokens.at(0)},
                                          std::vector<int32_t>(5000, 5), std::vector<int32_t>(9, 5)}) {
    r.resume_tokens = bad.data();
    r.resume_count = static_cast<uint32_t>(bad.size());
    EXPECT_EQ(Run(*engine, r).status().code(), Code::kInvalidArgument);
  }
  // Resumed at its limit: it ends at once, nothing sent, every token counted.
  const std::vector<int32_t> eight(8, 5);
  r.resume_tokens = eight.data();
  r.resume_count = 8;
  Result<Output> done = Run(*engine, r);
  ASSERT_TRUE(done.ok()) << done.status().ToString();
  EXPECT_TRUE(done->tokens.empty());
  EXPECT_TRUE(done->text.empty());
  EXPECT_EQ(done->result.completion_tokens, 8u);
  EXPECT_EQ(done->result.finish_reason, uint32_t{WP_FINISH_LENGTH});
}

// Version 10: the dead engine's KV cache comes with the resume (request.kv_source). A fresh
// engine copies the prompt and the tokens sent from it instead of computing them — the step
// reports the whole prompt as cached — and sends the same rest as one that computes everything.
// A source that is not this model's cache is no source: everything is computed, nothing is wrong.
TEST_F(TransformerResumeTest, AResumeCopiesWhatTheDeadEnginesCacheHoldsAndSendsTheSameRest) {
  std::string prompt;
  for (int i = 0; i < 12; ++i) prompt += "This program is free software; you can redistribute it. ";
  wp_generate_request request = Greedy(prompt, 40);
  std::vector<int32_t> whole_tokens;
  int cache_copy = -1;
  uint64_t cache_bytes = 0;
  {
    Result<Engine> dying = Loaded();
    ASSERT_TRUE(dying.ok()) << dying.status().ToString();
    Result<wp_region> cache = dying->ExportCache();
    ASSERT_TRUE(cache.ok()) << cache.status().ToString();
    cache_copy = dup(cache->handle);  // what the supervisor holds when the worker dies
    cache_bytes = cache->bytes;
    Result<Output> whole = Run(*dying, request);
    ASSERT_TRUE(whole.ok()) << whole.status().ToString();
    whole_tokens = whole->tokens;
    ASSERT_EQ(whole_tokens.size(), 40u);
  }  // the engine and its mapping are gone; the region stays while a descriptor names it
  const std::vector<int32_t> sent(whole_tokens.begin(), whole_tokens.begin() + 25);
  const std::vector<int32_t> rest(whole_tokens.begin() + 25, whole_tokens.end());
  wp_generate_request resumed = request;
  resumed.resume_tokens = sent.data();
  resumed.resume_count = static_cast<uint32_t>(sent.size());
  struct Case {
    int source;
    uint64_t bytes;
    bool copies;
  };
  const int not_a_cache = memfd_create("not-a-kv-cache", MFD_CLOEXEC);
  ASSERT_EQ(ftruncate(not_a_cache, static_cast<off_t>(cache_bytes)), 0);
  for (const Case& c : {Case{cache_copy, cache_bytes, true}, Case{not_a_cache, cache_bytes, false},
                        Case{cache_copy, cache_bytes - 1, false}, Case{-1, 0, false}}) {
    SCOPED_TRACE(::testing::Message() << "source " << (c.source == cache_copy ? "the cache" : "another region")
                                      << ", " << c.bytes << " bytes");
    Result<Engine> fresh = Loaded();
    ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
    wp_generate_request r = resumed;
    r.kv_source = c.source;
    r.kv_source_bytes = c.bytes;
    uint32_t prompt_tokens = 0;
    Result<wp_sequence*> sequence = fresh->OpenSequence(r, &prompt_tokens);
    ASSERT_TRUE(sequence.ok()) << sequence.status().ToString();
    const Stepped got = StepToEnd(*fresh, *sequence);
    EXPECT_EQ(got.tokens, rest);
    EXPECT_EQ(got.cached, c.copies ? prompt_tokens : 0u) << "of " << prompt_tokens << " prompt tokens";
  }
  close(not_a_cache);
  close(cache_copy);
}

// Version 11: an engine that closed cleanly (its model parked) leaves its cache to the next
// instance of the same weights, which adopts it as its own pool: a prompt the closed one computed
// is found in the prefix cache, whole blocks of it, and generates what a cold engine generates. A
// region that is no cache of this model is refused and leaves the engine serving with its own.
TEST_F(TransformerResumeTest, AnEngineAdoptsTheCacheAClosedOneLeftAndFindsItsPrefixes) {
  std::string prompt;
  for (int i = 0; i < 12; ++i) prompt += "This program is free software; you can redistribute it. ";
  const wp_generate_request request = Greedy(prompt, 16);
  int kept = -1;
  uint64_t bytes = 0;
  std::vector<int32_t> cold_tokens;
  uint32_t prompt_tokens = 0;
  {
    Result<Engine> earlier = Loaded();
    ASSERT_TRUE(earlier.ok()) << earlier.status().ToString();
    Result<Output> cold = Run(*earlier, request);
    ASSERT_TRUE(cold.ok()) << cold.status().ToString();
    cold_tokens = cold->tokens;
    prompt_tokens = cold->result.prompt_tokens;
    Result<wp_region> cache = earlier->ExportCache();
    ASSERT_TRUE(cache.ok());
    kept = dup(cache->handle);  // the supervisor's, with the parked copy
    bytes = cache->bytes;
  }
  ASSERT_GT(prompt_tokens, 128u);
  Result<Engine> later = Loaded();
  ASSERT_TRUE(later.ok()) << later.status().ToString();
  const int not_a_cache = memfd_create("not-a-kv-cache", MFD_CLOEXEC);
  ASSERT_EQ(ftruncate(not_a_cache, static_cast<off_t>(bytes)), 0);
  EXPECT_EQ(later->AdoptCache(not_a_cache, bytes).code(), Code::kInvalidArgument);
  close(not_a_cache);
  ASSERT_TRUE(later->AdoptCache(kept, bytes).ok());
  close(kept);
  Result<wp_region> exported = later->ExportCache();
  ASSERT_TRUE(exported.ok()) << "the adopted cache is the one it exports now";
  EXPECT_EQ(exported->bytes, bytes);

  uint32_t opened_tokens = 0;
  Result<wp_sequence*> sequence = later->OpenSequence(request, &opened_tokens);
  ASSERT_TRUE(sequence.ok()) << sequence.status().ToString();
  EXPECT_EQ(later->AdoptCache(exported->handle, bytes).code(), Code::kFailedPrecondition)
      << "not while a sequence holds blocks of the pool";
  const Stepped got = StepToEnd(*later, *sequence);
  EXPECT_EQ(got.tokens, cold_tokens);
  EXPECT_EQ(got.cached, (prompt_tokens - 1) / 64 * 64) << "the prompt's whole blocks, but the last token's";
}

}  // namespace
}  // namespace warmpool::transformer
