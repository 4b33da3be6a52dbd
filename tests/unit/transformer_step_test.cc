// A step of several sequences (CpuModel::Step, the CPU engine's continuous batching): every run of
// it computes what a forward pass of that sequence alone computes, decode steps and a prompt's
// chunk mixed, over several steps, on checkpoints of every architecture; bad steps are refused
// before anything is written.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "engines/bf16_gemv.h"
#include "engines/gemv.h"
#include "engines/transformer/checkpoint.h"
#include "engines/transformer/cpu_model.h"
#include "engines/transformer/random_checkpoint.h"
#include "engines/transformer/weights.h"
#include "tests/unit/temp_dir.h"

namespace warmpool::transformer {
namespace {

using safetensors::DType;

struct SteppedModel {
  std::unique_ptr<Checkpoint> checkpoint;
  ModelWeights weights;
  std::unique_ptr<CpuModel> model;
};

SteppedModel OpenStepped(const std::string& directory, const RandomCheckpoint& spec) {
  SteppedModel m;
  EXPECT_TRUE(WriteRandomCheckpoint(directory, spec).ok());
  Result<std::unique_ptr<Checkpoint>> checkpoint = Checkpoint::Open(directory);
  EXPECT_TRUE(checkpoint.ok()) << checkpoint.status().ToString();
  if (!checkpoint.ok()) return m;
  m.checkpoint = std::move(*checkpoint);
  Result<ModelWeights> weights = BindWeights(m.checkpoint->config(), m.checkpoint->tensors(), directory);
  EXPECT_TRUE(weights.ok());
  if (!weights.ok()) return m;
  m.weights = *weights;
  m.model = std::make_unique<CpuModel>(m.checkpoint->config(), m.weights, 2);
  return m;
}

std::vector<int32_t> SomeTokens(uint32_t count, uint32_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> out(count);
  for (int32_t& t : out) t = static_cast<int32_t>(rng() % vocab);
  return out;
}

// |a - b| relative to the largest logit of b.
double WorstDifference(std::span<const float> a, std::span<const float> b) {
  double scale = 1e-6, worst = 0;
  for (float v : b) scale = std::max(scale, double{std::fabs(v)});
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(double{a[i]} - b[i]));
  return worst / scale;
}

struct StepCase {
  const char* name;
  RandomCheckpoint spec;
  double tolerance;  // f32: the order of sums; bf16: its products' rounding
};

TEST(CpuModelStepTest, EachRunOfAStepComputesWhatItsSequenceAloneComputes) {
  RandomCheckpoint qwen2{.architecture = Architecture::kQwen2, .seed = 2};
  RandomCheckpoint qwen3{.architecture = Architecture::kQwen3, .seed = 3};
  RandomCheckpoint bf16{.seed = 4};
  bf16.dtype = DType::BF16;
  for (const StepCase& c : {StepCase{"llama f32", RandomCheckpoint{.seed = 1}, 1e-4},
                            StepCase{"qwen2 f32 (qkv bias)", qwen2, 1e-4}, StepCase{"qwen3 f32 (q/k norm)", qwen3, 1e-4},
                            StepCase{"llama bf16", bf16, 3e-2}}) {
    SCOPED_TRACE(c.name);
    testing::TempDir dir;
    SteppedModel m = OpenStepped(dir.path(), c.spec);
    ASSERT_NE(m.model, nullptr);
    const Config& config = m.checkpoint->config();
    const uint32_t vocab = config.vocab_size;
    // Six sequences prefilled alone, to different lengths; each has a twin cache for the reference.
    const std::vector<uint32_t> lengths = {3, 5, 9, 1, 12, 2};
    std::vector<std::unique_ptr<KvCache>> stepped, alone;
    std::vector<uint32_t> position;
    std::vector<float> logits(vocab);
    for (size_t i = 0; i < lengths.size(); ++i) {
      stepped.push_back(std::make_unique<KvCache>(config, 64));
      alone.push_back(std::make_unique<KvCache>(config, 64));
      const std::vector<int32_t> prompt = SomeTokens(lengths[i], vocab, 10 + static_cast<uint32_t>(i));
      ASSERT_TRUE(m.model->Forward(prompt, 0, *stepped[i], logits).ok());
      ASSERT_TRUE(m.model->Forward(prompt, 0, *alone[i], logits).ok());
      position.push_back(lengths[i]);
    }
    // A seventh joins with a prompt's first chunk (long enough for attention as matrix products).
    stepped.push_back(std::make_unique<KvCache>(config, 64));
    alone.push_back(std::make_unique<KvCache>(config, 64));
    position.push_back(0);
    // Three steps of all seven, then one of the first three alone (a small batch: on bf16
    // weights, the small-batch kernel rather than oneDNN).
    for (uint32_t step = 0; step < 4; ++step) {
      std::vector<int32_t> tokens;
      std::vector<StepRun> runs;
      for (size_t i = 0; i < (step < 3 ? stepped.size() : 3); ++i) {
        const uint32_t rows = i + 1 == stepped.size() ? 10 : 1;  // the newcomer's chunk, others decode
        const std::vector<int32_t> run = SomeTokens(rows, vocab, 100 * step + static_cast<uint32_t>(i));
        tokens.insert(tokens.end(), run.begin(), run.end());
        runs.push_back({stepped[i].get(), position[i], rows});
      }
      std::vector<float> all(runs.size() * uint64_t{vocab});
      ASSERT_TRUE(m.model->Step(tokens, runs, all).ok());
      size_t at = 0;
      for (size_t i = 0; i < runs.size(); ++i) {
        const std::span<const int32_t> run(tokens.data() + at, runs[i].rows);
        at += runs[i].rows;
        ASSERT_TRUE(m.model->Forward(run, position[i], *alone[i], logits).ok());
        EXPECT_LE(WorstDifference(std::span<const float>(all).subspan(i * vocab, vocab), logits), c.tolerance)
            << "sequence " << i << ", step " << step;
        position[i] += runs[i].rows;
      }
    }
  }
}

// Decode rows stepped beside others, each against its sequence's Forward alone, bit for bit.
void ExpectDecodeRowsInvariant(DType dtype) {
  // Products long enough (576, 1156 inputs) for oneDNN to sum them in another order than the
  // kernels; an intermediate size not a multiple of 16, whose rows' vectors end in tails.
  RandomCheckpoint spec{.hidden_size = 576, .intermediate_size = 1156, .seed = 5};
  spec.dtype = dtype;
  testing::TempDir dir;
  SteppedModel m = OpenStepped(dir.path(), spec);
  ASSERT_NE(m.model, nullptr);
  const Config& config = m.checkpoint->config();
  const uint32_t vocab = config.vocab_size;
  constexpr uint32_t kDecoders = 12, kPiece = 20;
  std::vector<std::unique_ptr<KvCache>> stepped, alone;
  std::vector<uint32_t> position;
  std::vector<float> logits(vocab);
  for (uint32_t i = 0; i < kDecoders; ++i) {
    stepped.push_back(std::make_unique<KvCache>(config, 128));
    alone.push_back(std::make_unique<KvCache>(config, 128));
    const std::vector<int32_t> prompt = SomeTokens(2 + i, vocab, 30 + i);
    ASSERT_TRUE(m.model->Forward(prompt, 0, *stepped[i], logits).ok());
    ASSERT_TRUE(m.model->Forward(prompt, 0, *alone[i], logits).ok());
    position.push_back(2 + i);
  }
  KvCache newcomer(config, 128);
  uint32_t newcomer_at = 0;
  enum class Piece { kNone, kAfter, kBefore };  // a prompt's piece in the step, after or before the decode rows
  struct Shape {
    uint32_t decoders;
    Piece piece;
  };
  for (const Shape& shape : {Shape{1, Piece::kNone}, Shape{5, Piece::kNone}, Shape{9, Piece::kNone},
                             Shape{12, Piece::kNone}, Shape{3, Piece::kAfter}, Shape{12, Piece::kAfter},
                             Shape{4, Piece::kBefore}, Shape{2, Piece::kNone}}) {
    SCOPED_TRACE(::testing::Message() << shape.decoders << " decode rows, piece " << static_cast<int>(shape.piece));
    std::vector<int32_t> tokens;
    std::vector<StepRun> runs;
    std::vector<uint32_t> decode_row(shape.decoders);  // each decode run's place among the runs
    auto add_piece = [&] {
      const std::vector<int32_t> piece = SomeTokens(kPiece, vocab, 70 + newcomer_at);
      tokens.insert(tokens.end(), piece.begin(), piece.end());
      runs.push_back({&newcomer, newcomer_at, kPiece});
      newcomer_at += kPiece;
    };
    if (shape.piece == Piece::kBefore) add_piece();
    for (uint32_t i = 0; i < shape.decoders; ++i) {
      decode_row[i] = static_cast<uint32_t>(runs.size());
      tokens.push_back(static_cast<int32_t>((7 * position[i] + i) % vocab));
      runs.push_back({stepped[i].get(), position[i], 1, true});
    }
    if (shape.piece == Piece::kAfter) add_piece();
    std::vector<float> all(runs.size() * uint64_t{vocab});
    ASSERT_TRUE(m.model->Step(tokens, runs, all).ok());
    for (uint32_t i = 0; i < shape.decoders; ++i) {
      const int32_t token = static_cast<int32_t>((7 * position[i] + i) % vocab);
      ASSERT_TRUE(m.model->Forward(std::span<const int32_t>(&token, 1), position[i], *alone[i], logits).ok());
      for (uint32_t t = 0; t < vocab; ++t) {
        ASSERT_EQ(all[uint64_t{decode_row[i]} * vocab + t], logits[t]) << "sequence " << i << ", logit " << t;
      }
      position[i] += 1;
    }
  }
}


// A decode row's logits are the same bits whatever shares its step: alone, beside 4, 8 or 11 other
// decode rows (the kernels' passes, their groups of outputs) and beside a prompt's piece that takes
// the step past 16 rows (which went to oneDNN before), on bf16 and f16 weights. A stream's
// greedy tokens then do not depend on what else its replica serves, and one resumed on another
// worker continues as it would have.
TEST(CpuModelStepTest, ADecodeRowIsTheSameBitsWhateverSharesItsStep) {
  int tried = 0;
  for (const DType dtype : {DType::BF16, DType::F16}) {
    if (!(dtype == DType::BF16 ? dense::HaveBF16Gemv() : dense::HaveF16Gemv())) continue;
    ++tried;
    SCOPED_TRACE(std::string(safetensors::DTypeName(dtype)));
    ExpectDecodeRowsInvariant(dtype);
  }
  if (tried == 0) GTEST_SKIP() << "this CPU has none of the small-batch kernels";
}

TEST(CpuModelStepTest, BadStepsAreRefusedBeforeAnythingIsWritten) {
  testing::TempDir dir;
  SteppedModel m = OpenStepped(dir.path(), RandomCheckpoint{});
  ASSERT_NE(m.model, nullptr);
  const Config& config = m.checkpoint->config();
  KvCache a(config, 8), b(config, 8);
  std::vector<float> logits(2 * uint64_t{config.vocab_size});
  const std::vector<int32_t> two = {1, 2};
  ASSERT_TRUE(m.model->Forward(std::vector<int32_t>{3}, 0, a, std::span<float>(logits).first(config.vocab_size)).ok());
  const float before = *a.key(0, 0);
  struct Bad {
    std::vector<int32_t> tokens;
    std::vector<StepRun> runs;
  };
  for (const Bad& bad : {Bad{two, {{&a, 0, 1}, {&a, 1, 1}}},                           // one cache twice
                         Bad{two, {{&a, 0, 1}}},                                       // tokens left over
                         Bad{two, {{&a, 0, 1}, {&b, 8, 1}}},                           // past the context
                         Bad{{1, static_cast<int32_t>(config.vocab_size)}, {{&a, 0, 1}, {&b, 0, 1}}},  // no such token
                         Bad{two, {{&a, 0, 1}, {nullptr, 0, 1}}},                      // no cache
                         Bad{two, {{&a, 0, 1}, {&b, 1, 1}}},                           // a gap after b's none
                         Bad{{}, {}}}) {
    EXPECT_EQ(m.model->Step(bad.tokens, bad.runs, logits).code(), Code::kInvalidArgument);
  }
  EXPECT_EQ(m.model->Step(two, std::vector<StepRun>{{&a, 0, 1}, {&b, 0, 1}}, std::span<float>(logits).first(10)).code(),
            Code::kInvalidArgument)
      << "logits too short";
  EXPECT_EQ(*a.key(0, 0), before) << "nothing written";
}

}  // namespace
}  // namespace warmpool::transformer
