// The transformer engine's CPU forward pass against tests/python/transformer_reference.py, a numpy
// reference written from the architectures' definitions, on random-initialised checkpoints of
// every supported architecture and dtype (warmpool-mkmodel --arch writes the same ones).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "engines/bf16_gemv.h"
#include "engines/transformer/checkpoint.h"
#include "engines/transformer/cpu_model.h"
#include "engines/transformer/decode_attention.h"
#include "engines/transformer/embedding.h"
#include "engines/transformer/generation.h"
#include "engines/transformer/random_checkpoint.h"
#include "engines/transformer/weights.h"
#include "tests/unit/temp_dir.h"

namespace warmpool::transformer {
namespace {

using warmpool::testing::TempDir;
using safetensors::DType;


// Runs the reference; returns its standard output. logits_out: where it writes the logits.
std::string RunReference(const std::string& directory, const std::vector<int32_t>& tokens,
                         const std::string& logits_out, int greedy = 0, const std::string& embedding_out = "") {
  std::string command = fmt::format("{} {}/tests/python/transformer_reference.py {} --tokens {}", WARMPOOL_PYTHON3,
                                    WARMPOOL_SOURCE_DIR, directory, fmt::join(tokens, ","));
  if (!logits_out.empty()) command += " --out " + logits_out;
  if (greedy > 0) command += fmt::format(" --greedy {}", greedy);
  if (!embedding_out.empty()) command += " --embedding " + embedding_out;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return "";
  std::string out;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof(buffer), pipe)) out.append(buffer, n);
  EXPECT_EQ(pclose(pipe), 0) << command;
  return out;
}

std::vector<double> ReadDoubles(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<double> values;
  double v;
  while (in.read(reinterpret_cast<char*>(&v), sizeof(v))) values.push_back(v);
  return values;
}

struct Loaded {
  std::unique_ptr<Checkpoint> checkpoint;
  Config config;  // the checkpoint's, its KV cache's element as asked
  ModelWeights weights;
  std::unique_ptr<CpuModel> model;
};

Loaded Load(const std::string& directory, int threads = 2, KvElement kv_element = KvElement::kF32) {
  Loaded loaded;
  Result<std::unique_ptr<Checkpoint>> checkpoint = Checkpoint::Open(directory);
  EXPECT_TRUE(checkpoint.ok()) << checkpoint.status().ToString();
  if (!checkpoint.ok()) return loaded;
  loaded.checkpoint = std::move(*checkpoint);
  loaded.config = loaded.checkpoint->config();
  loaded.config.kv_element = kv_element;
  Result<ModelWeights> weights =
      BindWeights(loaded.checkpoint->config(), loaded.checkpoint->tensors(), directory);
  EXPECT_TRUE(weights.ok()) << weights.status().ToString();
  if (!weights.ok()) return loaded;
  loaded.weights = *weights;
  loaded.model = std::make_unique<CpuModel>(loaded.config, loaded.weights, threads);
  return loaded;
}

std::vector<int32_t> Prompt(uint32_t length, uint32_t vocab, uint64_t seed) {
  std::mt19937_64 generator(seed);
  std::vector<int32_t> tokens;
  for (uint32_t i = 0; i < length; ++i) tokens.push_back(static_cast<int32_t>(generator() % vocab));
  return tokens;
}

// Every element within `relative` of the largest reference magnitude (logits are compared as a
// vector: a near-zero logit has no relative error of its own to speak of).
void ExpectNear(const std::vector<float>& got, const std::vector<double>& want, double relative,
                const std::string& context) {
  ASSERT_EQ(got.size(), want.size()) << context;
  double scale = 1e-30;
  for (double v : want) scale = std::max(scale, std::fabs(v));
  double worst = 0;
  size_t worst_at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << context << " element " << i << " is " << got[i];
    const double error = std::fabs(got[i] - want[i]);
    if (error > worst) worst = error, worst_at = i;
  }
  EXPECT_LE(worst, relative * scale) << context << ": element " << worst_at << " is " << got[worst_at]
                                     << ", the reference " << want[worst_at] << " (largest |logit| " << scale << ")";
}

struct Case {
  std::string name;
  RandomCheckpoint spec;
};

std::vector<Case> Cases() {
  std::vector<Case> cases;
  for (DType dtype : {DType::F32, DType::F16, DType::BF16}) {
    const std::string suffix = std::string(safetensors::DTypeName(dtype));
    RandomCheckpoint llama;
    llama.dtype = dtype;
    llama.seed = 11;
    cases.push_back({"llama " + suffix, llama});
    RandomCheckpoint mistral = llama;
    mistral.architecture = Architecture::kMistral;
    mistral.sliding_window = 5;  // shorter than the prompt: the window is exercised
    mistral.seed = 12;
    cases.push_back({"mistral (window 5) " + suffix, mistral});
    RandomCheckpoint qwen2 = llama;
    qwen2.architecture = Architecture::kQwen2;
    qwen2.tie_word_embeddings = true;
    qwen2.seed = 13;
    cases.push_back({"qwen2 (tied) " + suffix, qwen2});
    RandomCheckpoint qwen3 = llama;
    qwen3.architecture = Architecture::kQwen3;
    qwen3.head_dim = 32;  // Qwen3 heads are wider than hidden / heads
    qwen3.seed = 14;
    cases.push_back({"qwen3 " + suffix, qwen3});
  }
  RandomCheckpoint llama31;
  llama31.rope_scaling.kind = RopeScaling::Kind::kLlama3;
  llama31.rope_scaling.factor = 8;
  llama31.rope_scaling.low_freq_factor = 1;
  llama31.rope_scaling.high_freq_factor = 4;
  llama31.rope_scaling.original_max_position_embeddings = 64;  // every band (long, blended, short) is used
  llama31.rope_theta = 500000;
  llama31.tie_word_embeddings = true;
  llama31.attention_bias = true;
  llama31.num_key_value_heads = 1;
  llama31.seed = 15;
  cases.push_back({"llama 3.1 rope, tied, biased, one kv head", llama31});
  RandomCheckpoint linear;
  linear.rope_scaling.kind = RopeScaling::Kind::kLinear;
  linear.rope_scaling.factor = 4;
  linear.shards = 3;
  linear.seed = 16;
  cases.push_back({"llama linear rope, 3 shards", linear});
  RandomCheckpoint qwen3_bias;
  qwen3_bias.architecture = Architecture::kQwen3;
  qwen3_bias.attention_bias = true;
  qwen3_bias.num_key_value_heads = 4;
  qwen3_bias.seed = 17;
  cases.push_back({"qwen3 biased, no grouping", qwen3_bias});
  return cases;
}

// The prompt at once (every position's logits), token by token against a cache of its own, and in
// two runs (the second attending to the first's cache), each against the reference's logits.
void ExpectTheReference(const Case& c, Loaded& loaded, const std::vector<int32_t>& tokens,
                        const std::vector<double>& want, const std::string& name) {
  const uint32_t vocab = c.spec.vocab_size;
  KvCache cache(loaded.config, 64);
  std::vector<float> prefill(tokens.size() * vocab);
  ASSERT_TRUE(loaded.model->Forward(tokens, 0, cache, prefill, /*all_positions=*/true).ok()) << name;
  // Products on bf16 weights narrow the activations to bf16 (8 significant bits, as PyTorch's
  // bf16 and the GPU do), whether a prompt's or one token's (where the CPU has AVX-512 BF16), so
  // that a sequence's products are of one kind alone or in a step with others; other dtypes keep
  // them f32. A bf16 KV cache rounds the keys and values as PyTorch's bf16 does.
  const double products = c.spec.dtype == DType::BF16 ? 1e-2 : 1e-4;
  ExpectNear(prefill, want, products, name + ", prefill");

  KvCache stepped(loaded.config, 64);
  std::vector<float> decode(tokens.size() * vocab);
  for (uint32_t p = 0; p < tokens.size(); ++p) {
    ASSERT_TRUE(loaded.model->Forward({&tokens[p], 1}, p, stepped, {&decode[p * vocab], vocab}).ok()) << name;
  }
  ExpectNear(decode, want, c.spec.dtype == DType::BF16 && dense::HaveBF16Gemv() ? products : 1e-4, name + ", decode");
  ExpectNear(decode, std::vector<double>(prefill.begin(), prefill.end()), c.spec.dtype == DType::BF16 ? 1e-2 : 1e-5,
             name + ", decode vs prefill");

  KvCache split(loaded.config, 64);
  std::vector<float> last(vocab);
  ASSERT_TRUE(loaded.model->Forward({tokens.data(), 7}, 0, split, last).ok());
  ASSERT_TRUE(loaded.model->Forward({tokens.data() + 7, tokens.size() - 7}, 7, split, last).ok());
  ExpectNear(last, std::vector<double>(want.end() - vocab, want.end()), products, name + ", split prompt");
}

// Every architecture and dtype; a bf16 model also with the bf16 KV cache the engine gives it where
// this CPU can keep one (ChooseKvElement), against the same reference.
TEST(TransformerReference, PrefillAndDecodeLogitsMatchTheReferenceForEveryArchitectureAndDtype) {
  TempDir dir;
  for (const Case& c : Cases()) {
    const std::string model_dir = dir.File(fmt::format("m{}", c.spec.seed + 100 * int(c.spec.dtype)));
    ASSERT_TRUE(WriteRandomCheckpoint(model_dir, c.spec).ok()) << c.name;
    const std::vector<int32_t> tokens = Prompt(12, c.spec.vocab_size, c.spec.seed);
    RunReference(model_dir, tokens, dir.File("want.f64"));
    const std::vector<double> want = ReadDoubles(dir.File("want.f64"));
    Loaded loaded = Load(model_dir);
    ASSERT_NE(loaded.model, nullptr) << c.name;
    ExpectTheReference(c, loaded, tokens, want, c.name);
    const KvElement served = ChooseKvElement(c.spec.dtype, loaded.config.head_dim, /*on_device=*/false);
    if (served == KvElement::kF32) continue;
    Loaded bf16_cache = Load(model_dir, 2, served);
    ASSERT_NE(bf16_cache.model, nullptr) << c.name;
    ExpectTheReference(c, bf16_cache, tokens, want, c.name + ", bf16 KV cache");
  }
}

// An embedding is the last token's final state at unit length, for every architecture and dtype;
// one prompt is longer than a prefill piece, so it runs in pieces.
TEST(TransformerReference, EmbeddingsMatchTheReferenceForEveryArchitectureAndDtype) {
  TempDir dir;
  for (const Case& c : Cases()) {
    const std::string model_dir = dir.File(fmt::format("e{}", c.spec.seed + 100 * int(c.spec.dtype)));
    ASSERT_TRUE(WriteRandomCheckpoint(model_dir, c.spec).ok()) << c.name;
    Loaded loaded = Load(model_dir);
    ASSERT_NE(loaded.model, nullptr) << c.name;
    const uint32_t length = c.spec.seed % 3 == 0 ? kPrefillPiece + 20 : 12;
    const std::vector<int32_t> tokens = Prompt(length, c.spec.vocab_size, c.spec.seed);
    RunReference(model_dir, tokens, "", 0, dir.File("want.f64"));
    const std::vector<double> want = ReadDoubles(dir.File("want.f64"));
    KvCache cache(loaded.checkpoint->config(), 512);
    CpuSequence sequence(*loaded.model, cache);
    std::vector<float> got(loaded.checkpoint->config().hidden_size);
    Status s = EmbedTokens(sequence, tokens, got);
    ASSERT_TRUE(s.ok()) << s.ToString();
    ExpectNear(got, want, c.spec.dtype == DType::BF16 ? 1e-2 : 1e-4, fmt::format("{}, {} tokens", c.name, length));
    double squares = 0;
    for (float v : got) squares += double{v} * v;
    EXPECT_NEAR(squares, 1.0, 1e-5) << c.name;
  }
  Loaded loaded = Load(dir.File(fmt::format("e{}", Cases()[0].spec.seed + 100 * int(Cases()[0].spec.dtype))));
  KvCache small(loaded.checkpoint->config(), 8);
  CpuSequence sequence(*loaded.model, small);
  std::vector<float> out(loaded.checkpoint->config().hidden_size);
  std::vector<int32_t> nine(9, 1);
  EXPECT_EQ(EmbedTokens(sequence, nine, out).code(), Code::kInvalidArgument) << "past the context";
  EXPECT_EQ(EmbedTokens(sequence, {}, out).code(), Code::kInvalidArgument) << "no tokens";
}

TEST(TransformerReference, GreedyGenerationIsTokenIdenticalOverSixtyFourTokens) {
  TempDir dir;
  for (Architecture architecture : {Architecture::kLlama, Architecture::kQwen3}) {
    RandomCheckpoint spec;
    spec.architecture = architecture;
    spec.seed = 21;
    const std::string model_dir = dir.File(std::string(ArchitectureName(architecture)));
    ASSERT_TRUE(WriteRandomCheckpoint(model_dir, spec).ok());
    Loaded loaded = Load(model_dir);
    ASSERT_NE(loaded.model, nullptr);
    const std::vector<int32_t> prompt = Prompt(5, spec.vocab_size, 3);
    const std::string want = RunReference(model_dir, prompt, "", 64);

    KvCache cache(loaded.checkpoint->config(), 128);
    std::vector<float> logits(spec.vocab_size);
    ASSERT_TRUE(loaded.model->Forward(prompt, 0, cache, logits).ok());
    std::vector<int32_t> chosen;
    for (uint32_t position = prompt.size(); chosen.size() < 64; ++position) {
      const auto best = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      chosen.push_back(best);
      ASSERT_TRUE(loaded.model->Forward({&best, 1}, position, cache, logits).ok());
    }
    EXPECT_EQ(fmt::format("{}\n", fmt::join(chosen, ",")), want) << ArchitectureName(architecture);
  }
}

TEST(TransformerGeneration, GreedyGenerateMatchesTheReferenceAndStopsForEachReason) {
  TempDir dir;
  RandomCheckpoint spec;
  spec.architecture = Architecture::kQwen2;
  spec.seed = 31;
  ASSERT_TRUE(WriteRandomCheckpoint(dir.File("m"), spec).ok());
  Loaded loaded = Load(dir.File("m"));
  ASSERT_NE(loaded.model, nullptr);
  const Config& config = loaded.checkpoint->config();
  GenerationRequest request;
  request.prompt = Prompt(5, spec.vocab_size, 8);
  request.max_tokens = 12;
  request.sampling.temperature = 0;
  std::vector<int32_t> streamed;
  KvCache cache(config, 64);
  Result<Generation> greedy = Generate(*loaded.model, cache, request, [&](int32_t t) {
    streamed.push_back(t);
    return true;
  });
  ASSERT_TRUE(greedy.ok()) << greedy.status().ToString();
  EXPECT_EQ(greedy->finish, FinishReason::kLength);
  EXPECT_EQ(greedy->prompt_tokens, 5u);
  EXPECT_EQ(greedy->tokens, streamed);
  EXPECT_EQ(fmt::format("{}\n", fmt::join(greedy->tokens, ",")), RunReference(dir.File("m"), request.prompt, "", 12));

  // An end token: the output stops before it.
  GenerationRequest ending = request;
  ending.end_tokens = {greedy->tokens[4]};
  const auto first = std::find(greedy->tokens.begin(), greedy->tokens.end(), greedy->tokens[4]);
  KvCache cache2(config, 64);
  Result<Generation> stopped = Generate(*loaded.model, cache2, ending);
  ASSERT_TRUE(stopped.ok());
  EXPECT_EQ(stopped->finish, FinishReason::kStop);
  EXPECT_EQ(stopped->tokens, std::vector<int32_t>(greedy->tokens.begin(), first));

  // The caller stops it: at once, after exactly the tokens it saw.
  int seen = 0;
  KvCache cache3(config, 64);
  Result<Generation> cancelled = Generate(*loaded.model, cache3, request, [&](int32_t) { return ++seen < 3; });
  ASSERT_TRUE(cancelled.ok());
  EXPECT_EQ(cancelled->finish, FinishReason::kCancelled);
  EXPECT_EQ(cancelled->tokens, std::vector<int32_t>(greedy->tokens.begin(), greedy->tokens.begin() + 3));

  // A context of 8 holds the prompt and 3 more tokens; the 4th is chosen from the last position.
  KvCache small(config, 8);
  Result<Generation> full = Generate(*loaded.model, small, request);
  ASSERT_TRUE(full.ok());
  EXPECT_EQ(full->finish, FinishReason::kLength);
  EXPECT_EQ(full->tokens, std::vector<int32_t>(greedy->tokens.begin(), greedy->tokens.begin() + 4));

  // Sampled: the seed decides, and bad options or prompts are refused before anything runs.
  GenerationRequest sampled = request;
  sampled.sampling = {.temperature = 1.0, .top_p = 0.9, .seed = 5};
  KvCache a(config, 64), b(config, 64);
  EXPECT_EQ(Generate(*loaded.model, a, sampled)->tokens, Generate(*loaded.model, b, sampled)->tokens);
  sampled.sampling.top_p = 0;
  EXPECT_EQ(Generate(*loaded.model, a, sampled).status().code(), Code::kInvalidArgument);
  GenerationRequest too_long = request;
  too_long.prompt = Prompt(8, spec.vocab_size, 1);
  EXPECT_EQ(Generate(*loaded.model, small, too_long).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(Generate(*loaded.model, small, GenerationRequest{}).status().code(), Code::kInvalidArgument);
}

// A decode step splits outputs, never sums, over threads: any thread count gives the same bits.
// A prompt's products are oneDNN's, which may split a sum: the same within f32 rounding.
TEST(TransformerReference, DecodeIsBitIdenticalAtAnyThreadCountAndPrefillWithinRounding) {
  TempDir dir;
  RandomCheckpoint spec;
  ASSERT_TRUE(WriteRandomCheckpoint(dir.File("m"), spec).ok());
  const std::vector<int32_t> tokens = Prompt(9, spec.vocab_size, 5);
  std::vector<std::vector<float>> decoded, prefilled;
  for (int threads : {1, 2, 3}) {
    Loaded loaded = Load(dir.File("m"), threads);
    ASSERT_NE(loaded.model, nullptr);
    const uint32_t vocab = spec.vocab_size;
    KvCache stepped(loaded.checkpoint->config(), 16), whole(loaded.checkpoint->config(), 16);
    decoded.emplace_back(tokens.size() * vocab);
    for (uint32_t p = 0; p < tokens.size(); ++p) {
      ASSERT_TRUE(loaded.model->Forward({&tokens[p], 1}, p, stepped, {&decoded.back()[p * vocab], vocab}).ok());
    }
    prefilled.emplace_back(tokens.size() * vocab);
    ASSERT_TRUE(loaded.model->Forward(tokens, 0, whole, prefilled.back(), true).ok());
  }
  EXPECT_EQ(decoded[0], decoded[1]);
  EXPECT_EQ(decoded[0], decoded[2]);
  for (size_t t = 1; t < prefilled.size(); ++t) {
    ExpectNear(prefilled[t], std::vector<double>(prefilled[0].begin(), prefilled[0].end()), 1e-6,
               fmt::format("prefill with {} threads", t + 1));
  }
}

}  // namespace
}  // namespace warmpool::transformer
