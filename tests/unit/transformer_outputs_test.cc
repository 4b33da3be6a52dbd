// What a loaded transformer engine gives besides text, through its C ABI: embeddings (version 4)
// against the in-process path, with progress and a stop; log-probabilities against the log-softmax
// of the logits the model computes, recomputed here from the definition.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "engines/transformer/embedding.h"
#include "tests/text.h"
#include "tests/unit/transformer_engine_fixture.h"

namespace warmpool::transformer {
namespace {

using warmpool::testing::Contains;

// Embeddings through the ABI (version 4): each input on its own, as the in-process path makes it;
// a bad input among good ones is named; a version 3 vtable does not embed.
TEST_F(TransformerEngineTest, EmbeddingsThroughTheAbiAreTheInProcessOnesAndABadInputIsNamed) {
  Result<Engine> engine = OpenDirectory();
  ASSERT_TRUE(engine.ok() && engine->Load().ok());
  ASSERT_TRUE(engine->embeds());
  const uint32_t size = engine->info().embedding_size;
  EXPECT_EQ(size, 64u) << "the hidden size";
  Result<Engine::Embeddings> out = engine->Embed({"the GNU General Public License", "free software"});
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  ASSERT_EQ(out->values.size(), 2u * size);

  Result<ModelDirectory> m = ModelDirectory::Open(dir_.path());
  ASSERT_TRUE(m.ok());
  const Config config = Served(*m);
  Result<ModelWeights> weights = BindWeights(config, m->checkpoint->tensors(), "tiny");
  CpuModel model(config, *weights, 1);
  KvCache cache(config, 2048);
  CpuSequence sequence(model, cache);
  const std::vector<int32_t> tokens = *m->tokenizer->Encode("free software", /*add_special_tokens=*/true);
  std::vector<float> want(size);
  ASSERT_TRUE(EmbedTokens(sequence, tokens, want).ok());
  EXPECT_EQ(out->tokens[1], tokens.size());
  for (uint32_t i = 0; i < size; i++) EXPECT_FLOAT_EQ(out->values[size + i], want[i]) << i;

  // Progress between inputs and the pieces of a long one, in tokens of all; stopping it stops it.
  const std::string long_input(1500, 'a');
  std::vector<uint64_t> seen;
  Result<Engine::Embeddings> watched = engine->Embed({"x", long_input}, [&](uint64_t done, uint64_t total) {
    EXPECT_LT(done, total);
    seen.push_back(done);
    return true;
  });
  ASSERT_TRUE(watched.ok()) << watched.status().ToString();
  ASSERT_GE(seen.size(), 2u) << "after the first input, and between the long one's pieces";
  EXPECT_TRUE(std::is_sorted(seen.begin(), seen.end()));
  Result<Engine::Embeddings> stopped = engine->Embed({"x", long_input}, [](uint64_t, uint64_t) { return false; });
  ASSERT_FALSE(stopped.ok());
  EXPECT_EQ(stopped.status().code(), Code::kUnavailable);

  Result<Engine::Embeddings> too_long = engine->Embed({"fine", std::string(20000, 'x')});
  ASSERT_FALSE(too_long.ok());
  EXPECT_EQ(too_long.status().code(), Code::kInvalidArgument);
  EXPECT_TRUE(Contains(too_long.status().message(), "input 1")) << too_long.status().message();

  wp_engine_vtable v3 = *FindBuiltinEngine("transformer");
  v3.abi_version = 3;
  wp_engine_spec spec = SpecForFile("tiny", dir_.path().c_str(), nullptr, 0, 0);
  spec.has_directory = 1;
  spec.directory_fd = directory_;
  Result<Engine> older = Engine::Open(&v3, spec, memory_.service());
  ASSERT_TRUE(older.ok()) << older.status().ToString();
  EXPECT_FALSE(older->embeds()) << "a version 3 vtable has no embed entry to read";
}

// Log-probabilities, checked from their definition: the log-softmax of the logits the model
// computes for the sequence so far (recomputed here in process, in double), for the chosen token
// and the most likely ones, most likely first; greedy chooses the first of them.
TEST_F(TransformerEngineTest, EachTokensLogprobsAreTheLogSoftmaxOfTheModelsLogitsAtThatStep) {
  Result<Engine> engine = OpenDirectory();
  ASSERT_TRUE(engine.ok() && engine->Load().ok());
  const std::string prompt = "This program is free software";
  wp_generate_request r = Greedy(prompt, 6);
  r.logprobs = 1;
  r.top_logprobs = 5;
  std::vector<int32_t> tokens;
  std::vector<wp_token_logprobs> seen;
  std::vector<std::vector<wp_logprob>> tops;
  std::vector<std::string> pieces;
  Result<wp_generate_result> done = engine->Generate(
      r, [&](std::string_view, std::span<const int32_t> t, std::span<const wp_token_logprobs> l) {
        EXPECT_EQ(l.size(), t.size()) << "one per token";
        tokens.insert(tokens.end(), t.begin(), t.end());
        for (const wp_token_logprobs& x : l) {
          seen.push_back(x);
          tops.emplace_back(x.top, x.top + x.top_count);
          pieces.emplace_back(x.chosen.piece.data, x.chosen.piece.bytes);
        }
        return true;
      });
  ASSERT_TRUE(done.ok()) << done.status().ToString();
  ASSERT_EQ(seen.size(), tokens.size());
  ASSERT_FALSE(tokens.empty());

  Result<ModelDirectory> m = ModelDirectory::Open(dir_.path());
  ASSERT_TRUE(m.ok());
  const Config config = Served(*m);
  Result<ModelWeights> weights = BindWeights(config, m->checkpoint->tensors(), "tiny");
  CpuModel model(config, *weights, 1);
  // The logits as the model computes them at each step: the prompt, then a token at a time.
  const std::vector<int32_t> prompt_tokens = *m->tokenizer->Encode(prompt, /*add_special_tokens=*/true);
  std::vector<float> logits(config.vocab_size);
  KvCache cache(config, 2048);
  ASSERT_TRUE(model.Forward(prompt_tokens, 0, cache, logits).ok());
  for (size_t step = 0; step < tokens.size(); step++) {
    if (step > 0) {
      const auto position = static_cast<uint32_t>(prompt_tokens.size() + step - 1);
      ASSERT_TRUE(model.Forward({&tokens[step - 1], 1}, position, cache, logits).ok());
    }
    double max = -INFINITY, sum = 0;
    for (float x : logits) max = std::max(max, double{x});
    for (float x : logits) sum += std::exp(double{x} - max);
    auto logprob = [&](int32_t id) { return double{logits[static_cast<size_t>(id)]} - max - std::log(sum); };
    EXPECT_EQ(seen[step].chosen.token, tokens[step]);
    EXPECT_NEAR(seen[step].chosen.logprob, logprob(tokens[step]), 1e-4) << "step " << step;
    ASSERT_EQ(tops[step].size(), 5u);
    EXPECT_EQ(tops[step][0].token, tokens[step]) << "greedy takes the most likely";
    for (size_t i = 0; i < tops[step].size(); i++) {
      EXPECT_NEAR(tops[step][i].logprob, logprob(tops[step][i].token), 1e-4);
      if (i > 0) {
        EXPECT_GE(tops[step][i - 1].logprob, tops[step][i].logprob);
      }
    }
    EXPECT_EQ(pieces[step], *m->tokenizer->DecodePieces({&tokens[step], 1}));
  }
  r.top_logprobs = 21;
  EXPECT_EQ(engine->Generate(r, [](auto, auto, auto) { return true; }).status().code(), Code::kInvalidArgument);
}

TEST(LogprobsOf, NanIsImpossibleAndTiesGoToTheLowerId) {
  const std::vector<float> logits = {1.0f, NAN, 3.0f, 3.0f, -INFINITY};
  TokenLogprobs l = LogprobsOf(logits, 1, 4);
  EXPECT_EQ(l.logprob, -INFINITY) << "NaN is impossible";
  ASSERT_EQ(l.top.size(), 4u);
  EXPECT_EQ(l.top[0].first, 2);
  EXPECT_EQ(l.top[1].first, 3);
  EXPECT_EQ(l.top[2].first, 0);
  const double total = std::exp(l.top[0].second) + std::exp(l.top[1].second) + std::exp(l.top[2].second);
  EXPECT_NEAR(total, 1.0, 1e-6);
  EXPECT_EQ(LogprobsOf(std::vector<float>(3, NAN), 0, 2).logprob, -INFINITY) << "no number at all: nothing is possible";
}
// Typed tensors (version 5): input_ids in, the next token's logits out, as the model computes them
// for that run of tokens (in pieces, as a prompt: 300 tokens take two); bad ids are named.
TEST_F(TransformerEngineTest, TypedTensorsGiveTheLogitsAfterARunOfTokenIds) {
  Result<Engine> engine = OpenDirectory();
  ASSERT_TRUE(engine.ok() && engine->Load().ok());
  Result<Engine::TensorSignature> signature = engine->Signature();
  ASSERT_TRUE(signature.ok() && signature->stated);
  Result<ModelDirectory> m = ModelDirectory::Open(dir_.path());
  ASSERT_TRUE(m.ok());
  const Config config = Served(*m);
  EXPECT_EQ(signature->outputs[0].shape[0], config.vocab_size);

  std::vector<int64_t> ids(300);
  for (size_t i = 0; i < ids.size(); i++) ids[i] = static_cast<int64_t>((i * 37 + 5) % config.vocab_size);
  auto run = [&](std::vector<int64_t> values, std::vector<float>* logits = nullptr) {
    wp_tensor in{"input_ids", WP_DTYPE_I64, 1, {static_cast<int64_t>(values.size())}, values.data(),
                 values.size() * sizeof(int64_t)};
    return engine->Run(std::span(&in, 1), [&](const wp_tensor& out) {
      EXPECT_STREQ(out.name, "logits");
      if (logits != nullptr) {
        logits->resize(out.bytes / sizeof(float));
        std::memcpy(logits->data(), out.data, out.bytes);
      }
      return OkStatus();
    });
  };
  std::vector<float> got;
  ASSERT_TRUE(run(ids, &got).ok());

  Result<ModelWeights> weights = BindWeights(config, m->checkpoint->tensors(), "tiny");
  CpuModel model(config, *weights, 1);
  KvCache cache(config, 2048);
  CpuSequence sequence(model, cache);
  std::vector<int32_t> tokens(ids.begin(), ids.end());
  std::vector<float> want(config.vocab_size);
  ASSERT_TRUE(sequence.Forward(tokens, 0, want).ok());
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); i++) EXPECT_NEAR(got[i], want[i], 1e-4f * (1 + std::fabs(want[i]))) << i;

  // A run longer than a piece says how far it got between pieces, and stops when told to.
  std::vector<uint64_t> seen;
  wp_tensor long_run{"input_ids", WP_DTYPE_I64, 1, {static_cast<int64_t>(ids.size())}, ids.data(),
                     ids.size() * sizeof(int64_t)};
  Status watched = engine->Run(
      std::span(&long_run, 1), [](const wp_tensor&) { return OkStatus(); }, 0,
      [&](uint64_t done, uint64_t total) {
        seen.push_back(done);
        EXPECT_EQ(total, ids.size());
        return true;
      });
  ASSERT_TRUE(watched.ok()) << watched.ToString();
  EXPECT_EQ(seen, std::vector<uint64_t>{kPrefillPiece});
  Status stopped = engine->Run(
      std::span(&long_run, 1), [](const wp_tensor&) { return OkStatus(); }, 0, [](uint64_t, uint64_t) { return false; });
  EXPECT_EQ(stopped.code(), Code::kUnavailable) << stopped.ToString();
  Status small = engine->Run(std::span(&long_run, 1), [](const wp_tensor&) { return OkStatus(); }, 64);
  EXPECT_EQ(small.code(), Code::kResourceExhausted) << "the logits would not fit a reply of 64 bytes";

  Status out_of_range = run({1, static_cast<int64_t>(config.vocab_size)});
  EXPECT_EQ(out_of_range.code(), Code::kInvalidArgument);
  EXPECT_TRUE(Contains(out_of_range.message(), "input_ids[1] is")) << out_of_range.message();
  EXPECT_EQ(run({-1}).code(), Code::kInvalidArgument);
  EXPECT_EQ(run({int64_t{1} << 40}).code(), Code::kInvalidArgument) << "no wrap to a small id";
  EXPECT_EQ(run({}).code(), Code::kInvalidArgument) << "no tokens";
  EXPECT_EQ(run(std::vector<int64_t>(engine->info().context + 1, 1)).code(), Code::kInvalidArgument);
  const int32_t narrow[2] = {1, 2};
  wp_tensor i32{"input_ids", WP_DTYPE_I32, 1, {2}, narrow, sizeof(narrow)};
  Status wrong = engine->Run(std::span(&i32, 1), [](const wp_tensor&) { return OkStatus(); });
  EXPECT_TRUE(Contains(wrong.message(), "the model takes i64 [-1]")) << wrong.message();
}

}  // namespace
}  // namespace warmpool::transformer
