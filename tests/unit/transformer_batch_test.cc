// Continuous batching behind the C ABI (engine ABI version 7: open_sequence, step, close_sequence):
// sequences stepped together, joining and leaving between steps, generate what each generates alone
// through the generate call; a long prompt goes in pieces while the others decode a token every
// step; sequences run out and come back; bad steps are refused. A prompt that begins as an earlier
// one did takes that prefix's KV blocks instead of computing them (the prefix cache), and generates
// what a cold cache generates.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "engines/transformer/packed_model.h"
#include "engines/transformer/sequence_slots.h"
#include "tests/unit/transformer_engine_fixture.h"

namespace warmpool::transformer {
namespace {

// Greedy decisions on f32 weights: a step of several sequences computes each within float rounding
// of the sequence alone, so the tokens are the same.
class TransformerBatchTest : public TransformerEngineTest {
 protected:
  TransformerBatchTest() { spec_.dtype = safetensors::DType::F32; }

  Result<Engine> Loaded(uint32_t sequences = 0) { return LoadDirectory(0, sequences); }

  struct Open {
    wp_sequence* sequence = nullptr;
    Output out;
    bool ended = false;
    uint32_t cached = 0;  // of its prompt's tokens, found in the prefix cache
  };
  // One step of every open sequence not ended; each one's output and result recorded. Returns how
  // many tokens each got in this step (by position in `open`), -1 for those not in it.
  static std::vector<int> StepAll(Engine& engine, std::vector<Open*> open) {
    std::vector<wp_sequence_step> steps;
    std::vector<Open*> in;
    for (Open* o : open) {
      if (o->ended) continue;
      steps.push_back(wp_sequence_step{o->sequence, 0, WP_OK, {}, {}, 0});
      in.push_back(o);
    }
    std::vector<int> got(open.size(), -1);
    std::map<Open*, int> tokens;
    for (Open* o : in) tokens[o] = 0;
    Status s = engine.Step(steps, [&](uint32_t i, std::string_view text, std::span<const int32_t> t,
                                      std::span<const wp_token_logprobs>) {
      in[i]->out.text += text;
      in[i]->out.tokens.insert(in[i]->out.tokens.end(), t.begin(), t.end());
      tokens[in[i]] += static_cast<int>(t.size());
    });
    EXPECT_TRUE(s.ok()) << s.ToString();
    for (size_t i = 0; i < in.size(); ++i) {
      EXPECT_EQ(steps[i].status, WP_OK) << steps[i].error;
      in[i]->cached = steps[i].cached_tokens;
      if (steps[i].ended != 0) {
        in[i]->ended = true;
        in[i]->out.result = steps[i].result;
        engine.CloseSequence(in[i]->sequence);
      }
    }
    for (size_t i = 0; i < open.size(); ++i) {
      if (tokens.contains(open[i])) got[i] = tokens[open[i]];
    }
    return got;
  }
  // Runs one sequence alone to its end.
  static void RunAlone(Engine& engine, Open& o) {
    for (int steps = 0; !o.ended && steps < 500; ++steps) StepAll(engine, {&o});
  }
  static Open OpenOne(Engine& engine, const wp_generate_request& request) {
    Open o;
    Result<wp_sequence*> s = engine.OpenSequence(request);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    if (s.ok()) o.sequence = *s;
    o.ended = !s.ok();
    return o;
  }
};

TEST_F(TransformerBatchTest, SequencesSteppedTogetherGenerateWhatEachGeneratesAlone) {
  Result<Engine> engine = Loaded();
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  ASSERT_TRUE(engine->steps());
  EXPECT_EQ(engine->info().sequences, kDefaultSequences);

  const std::string prompts[] = {"This program is free software", "you can redistribute it",
                                 "WITHOUT ANY WARRANTY; without even", "GNU General Public License"};
  std::vector<wp_generate_request> requests;
  for (const std::string& p : prompts) requests.push_back(Greedy(p, 20));
  requests[1].set = WP_SET_TEMPERATURE | WP_SET_SEED | WP_SET_TOP_K;  // sampled: the seed decides alone
  requests[1].temperature = 0.9f;
  requests[1].seed = 7;
  requests[1].top_k = 20;
  requests[2].max_tokens = 9;  // leaves early
  const wp_string stop{"e", 1};
  requests[3].stop = &stop;  // text cut at a stop string
  requests[3].stop_count = 1;

  std::vector<Output> alone;
  for (const wp_generate_request& r : requests) {
    Result<Output> out = Run(*engine, r);
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    alone.push_back(*out);
  }

  // Three start together; the fourth joins after four steps, as a new request between steps would.
  std::vector<Open> open(4);
  for (int i = 0; i < 3; ++i) open[i] = OpenOne(*engine, requests[i]);
  open[3].ended = true;
  int steps = 0;
  auto any_running = [&] {
    for (const Open& o : open) {
      if (!o.ended) return true;
    }
    return false;
  };
  while (any_running() || steps < 4) {
    if (steps == 4) open[3] = OpenOne(*engine, requests[3]);
    StepAll(*engine, {&open[0], &open[1], &open[2], &open[3]});
    ASSERT_LT(++steps, 200);
  }
  for (int i = 0; i < 4; ++i) {
    SCOPED_TRACE(prompts[i]);
    EXPECT_EQ(open[i].out.tokens, alone[i].tokens);
    EXPECT_EQ(open[i].out.text, alone[i].text);
    EXPECT_EQ(open[i].out.result.finish_reason, alone[i].result.finish_reason);
    EXPECT_EQ(open[i].out.result.completion_tokens, alone[i].result.completion_tokens);
    EXPECT_EQ(open[i].out.result.prompt_tokens, alone[i].result.prompt_tokens);
  }
  EXPECT_EQ(open[2].out.tokens.size(), 9u);
  EXPECT_EQ(open[3].out.result.finish_reason, uint32_t{WP_FINISH_STOP});
  EXPECT_EQ(open[3].out.text.find('e'), std::string::npos);
}

TEST_F(TransformerBatchTest, ALongPromptGoesInPiecesWhileTheOthersDecodeATokenEveryStep) {
  Result<Engine> engine = Loaded();
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  Open running = OpenOne(*engine, Greedy("This program is free software", 260));  // outlasts a prompt a token a step
  while (running.out.tokens.empty()) StepAll(*engine, {&running});

  std::vector<int32_t> long_prompt(200);
  for (size_t i = 0; i < long_prompt.size(); ++i) long_prompt[i] = static_cast<int32_t>(3 + i % 200);
  wp_generate_request r = Greedy("", 4);
  r.tokens = long_prompt.data();
  r.token_count = long_prompt.size();
  Open joining = OpenOne(*engine, r);
  int steps_to_first_token = 0;
  while (joining.out.tokens.empty()) {
    std::vector<int> got = StepAll(*engine, {&running, &joining});
    ASSERT_FALSE(running.ended) << "it ran out before the prompt was through";
    EXPECT_EQ(got[0], 1) << "the decoding sequence gets a token every step";
    ASSERT_LE(++steps_to_first_token, 240) << "a prompt token a step at least, but for the pacer's probes";
  }
  // The engine's pacer (step_pacer.h) sizes the pieces by the steps' times: at most
  // kStepPromptTokens each, never the whole prompt at once.
  const int pieces = (200 + kStepPromptTokens - 1) / kStepPromptTokens;
  EXPECT_GE(steps_to_first_token, pieces) << "in pieces of at most " << kStepPromptTokens << " tokens beside a decode";

  // Alone, its prompt goes whole (a piece of kPrefillPiece tokens): the same tokens either way.
  engine->CloseSequence(running.sequence);
  while (!joining.ended) StepAll(*engine, {&joining});
  Result<Output> alone = Run(*engine, r);
  ASSERT_TRUE(alone.ok()) << alone.status().ToString();
  EXPECT_EQ(joining.out.tokens, alone->tokens);
}

TEST_F(TransformerBatchTest, SequencesRunOutAndAClosedOneIsFreeForAnother) {
  Result<Engine> engine = Loaded(2);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  EXPECT_EQ(engine->info().sequences, 2u);
  Result<Engine> four = Loaded(4);
  ASSERT_TRUE(four.ok());
  Result<ModelDirectory> files = ModelDirectory::Open(dir_.path());
  ASSERT_TRUE(files.ok());
  const uint64_t vocab = files->checkpoint->config().vocab_size;
  EXPECT_EQ(four->info().workspace_bytes - engine->info().workspace_bytes,
            2 * engine->info().context * engine->info().kv_bytes_per_token + 2 * vocab * sizeof(float))
      << "a KV cache of the whole context, and a row of logits, per sequence";

  Open a = OpenOne(*engine, Greedy("This program", 30));
  Open b = OpenOne(*engine, Greedy("is free software", 30));
  StepAll(*engine, {&a, &b});
  Result<wp_sequence*> third = engine->OpenSequence(Greedy("one too many", 4));
  EXPECT_EQ(third.status().code(), Code::kResourceExhausted) << third.status().ToString();
  EXPECT_EQ(engine->Embed({"text"}).status().code(), Code::kFailedPrecondition)
      << "embeddings use a generation's cache: not while one is open";

  engine->CloseSequence(a.sequence);  // its client left mid-generation
  Open c = OpenOne(*engine, Greedy("This program", 30));
  ASSERT_FALSE(c.ended);
  while (!b.ended || !c.ended) StepAll(*engine, {&b, &c});
  Result<Output> alone = Run(*engine, Greedy("This program", 30));
  ASSERT_TRUE(alone.ok());
  EXPECT_EQ(c.out.tokens, alone->tokens) << "a slot left mid-way is written over from the start";
  EXPECT_TRUE(engine->Embed({"text"}).ok()) << "none open: embeddings run again";
}

TEST_F(TransformerBatchTest, BadSequencesAndStepsAreRefusedAndTheOthersGoOn) {
  Result<Engine> engine = Loaded();
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  wp_generate_request bad = Greedy("x", 4);
  bad.set |= WP_SET_TOP_P;
  bad.top_p = -1;
  EXPECT_EQ(engine->OpenSequence(bad).status().code(), Code::kInvalidArgument);
  std::vector<int32_t> outside = {1, 99999};
  wp_generate_request ids = Greedy("", 4);
  ids.tokens = outside.data();
  ids.token_count = outside.size();
  EXPECT_EQ(engine->OpenSequence(ids).status().code(), Code::kInvalidArgument);

  Open a = OpenOne(*engine, Greedy("This program", 3));
  std::vector<wp_sequence_step> twice = {{a.sequence, 0, WP_OK, {}, {}, 0}, {a.sequence, 0, WP_OK, {}, {}, 0}};
  EXPECT_EQ(engine->Step(twice, nullptr).code(), Code::kInvalidArgument);
  std::vector<wp_sequence_step> none = {{nullptr, 0, WP_OK, {}, {}, 0}};
  EXPECT_EQ(engine->Step(none, nullptr).code(), Code::kInvalidArgument);
  while (!a.ended) StepAll(*engine, {&a});
  EXPECT_EQ(a.out.tokens.size(), 3u) << "the refused steps ran nothing of it";
}

// A request by token ids: `count` tokens from `first` on, cycling through the vocabulary's start.
wp_generate_request ByIds(std::vector<int32_t>& ids, uint32_t count, int32_t first, uint32_t max_tokens) {
  ids.resize(count);
  for (uint32_t i = 0; i < count; ++i) ids[i] = 3 + (first + static_cast<int32_t>(i)) % 200;
  wp_generate_request r{};
  r.tokens = ids.data();
  r.token_count = ids.size();
  r.max_tokens = max_tokens;
  r.set = WP_SET_TEMPERATURE;
  r.temperature = 0;
  return r;
}

TEST_F(TransformerBatchTest, APromptThatBeginsAsAnEarlierOneReusesItsBlocksAndGeneratesTheSame) {
  Result<Engine> warm = Loaded();
  ASSERT_TRUE(warm.ok()) << warm.status().ToString();
  std::vector<int32_t> first_ids, second_ids, other_ids;
  Open first = OpenOne(*warm, ByIds(first_ids, 150, 0, 8));
  RunAlone(*warm, first);
  EXPECT_EQ(first.cached, 0u) << "a cold cache";

  // The next turn: the same 150 tokens and 20 more, greedy and then seeded sampling. Two whole
  // blocks (128 tokens) come from the cache; the rest is computed.
  wp_generate_request second = ByIds(second_ids, 170, 0, 16);
  wp_generate_request sampled = second;
  sampled.set = WP_SET_TEMPERATURE | WP_SET_SEED;
  sampled.temperature = 0.8f;
  sampled.seed = 3;
  for (const wp_generate_request& r : {second, sampled}) {
    Open reused = OpenOne(*warm, r);
    RunAlone(*warm, reused);
    EXPECT_EQ(reused.cached, 128u);
    EXPECT_EQ(reused.out.result.prompt_tokens, 170u);
    Result<Engine> cold = Loaded();
    ASSERT_TRUE(cold.ok());
    Open fresh = OpenOne(*cold, r);
    RunAlone(*cold, fresh);
    EXPECT_EQ(fresh.cached, 0u);
    EXPECT_EQ(reused.out.tokens, fresh.out.tokens) << "the reused prefix computes what a cold cache does";
    EXPECT_EQ(reused.out.text, fresh.out.text);
  }

  // A prompt of exactly two blocks reuses one: its last token runs, for the logits.
  std::vector<int32_t> exact_ids;
  Open exact = OpenOne(*warm, ByIds(exact_ids, 128, 0, 2));
  RunAlone(*warm, exact);
  EXPECT_EQ(exact.cached, 64u);
  Open other = OpenOne(*warm, ByIds(other_ids, 150, 1, 2));
  RunAlone(*warm, other);
  EXPECT_EQ(other.cached, 0u) << "another beginning finds nothing";
}

// While a sequence still runs, another whose prompt begins as its did shares its published blocks;
// each goes on to write blocks of its own and generates what it generates alone.
TEST_F(TransformerBatchTest, RunningSequencesShareAPrefixAndEachGeneratesWhatItDoesAlone) {
  Result<Engine> engine = Loaded();
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  std::vector<int32_t> a_ids, b_ids;
  const wp_generate_request a_request = ByIds(a_ids, 140, 5, 40), b_request = ByIds(b_ids, 200, 5, 40);
  Open a = OpenOne(*engine, a_request);
  while (a.out.tokens.empty()) StepAll(*engine, {&a});  // its prompt is through: two blocks published
  Open b = OpenOne(*engine, b_request);
  for (int steps = 0; (!a.ended || !b.ended) && steps < 500; ++steps) StepAll(*engine, {&a, &b});
  EXPECT_EQ(b.cached, 128u);

  for (auto [request, together] : {std::pair{a_request, &a}, std::pair{b_request, &b}}) {
    Result<Engine> cold = Loaded();
    ASSERT_TRUE(cold.ok());
    Open alone = OpenOne(*cold, request);
    RunAlone(*cold, alone);
    EXPECT_EQ(together->out.tokens, alone.out.tokens);
  }
}

}  // namespace
}  // namespace warmpool::transformer
