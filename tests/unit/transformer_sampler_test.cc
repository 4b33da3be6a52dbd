// The sampler against its definitions (Hugging Face's logits processors and warpers), on logits
// small enough to work out by hand, and with hostile logits (NaN, infinite).
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

#include "engines/transformer/sampler.h"
#include "tests/text.h"

namespace warmpool::transformer {
namespace {

using warmpool::testing::Contains;

// softmax over the tokens in `kept` (the others impossible), from the definition.
std::vector<double> SoftmaxOver(const std::vector<float>& logits, const std::vector<size_t>& kept,
                                double temperature = 1.0) {
  std::vector<double> p(logits.size(), 0.0);
  double total = 0;
  for (size_t i : kept) total += p[i] = std::exp(logits[i] / temperature);
  for (double& v : p) v /= total;
  return p;
}

void ExpectDistribution(const SamplingOptions& options, const std::vector<float>& logits,
                        const std::vector<int32_t>& seen, const std::vector<double>& want, const char* what) {
  Sampler sampler(options);
  Result<std::vector<double>> got = sampler.Distribution(logits, seen);
  ASSERT_TRUE(got.ok()) << what << ": " << got.status().ToString();
  ASSERT_EQ(got->size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR((*got)[i], want[i], 1e-12) << what << ", token " << i;
}

// Probabilities of {1, 2, 3, 4, 0}: 0.0861, 0.2341, 0.6364, 0.0117 for token 4 and 0.0317 for token 0.
const std::vector<float> kLogits = {1, 2, 3, 4, 0};

TEST(TransformerSampler, EachFilterKeepsWhatItsDefinitionKeeps) {
  ExpectDistribution({}, kLogits, {}, SoftmaxOver(kLogits, {0, 1, 2, 3, 4}), "plain softmax");
  ExpectDistribution({.temperature = 2}, kLogits, {}, SoftmaxOver(kLogits, {0, 1, 2, 3, 4}, 2), "temperature 2");
  ExpectDistribution({.top_k = 2}, kLogits, {}, SoftmaxOver(kLogits, {2, 3}), "top_k 2");
  ExpectDistribution({.top_k = 9}, kLogits, {}, SoftmaxOver(kLogits, {0, 1, 2, 3, 4}), "top_k above the vocabulary");
  // top_p: from the least likely up, cumulative 0.0117, 0.0434, 0.1295, 0.3636, 1: at p = 0.7 the
  // first three add up to no more than 0.3 and go.
  ExpectDistribution({.top_p = 0.7}, kLogits, {}, SoftmaxOver(kLogits, {2, 3}), "top_p 0.7");
  ExpectDistribution({.top_p = 0.5}, kLogits, {}, SoftmaxOver(kLogits, {3}), "top_p 0.5");
  ExpectDistribution({.top_p = 0.9}, kLogits, {}, SoftmaxOver(kLogits, {1, 2, 3}), "top_p 0.9");
  // min_p 0.2: below 0.2 x 0.6364 = 0.1273 goes.
  ExpectDistribution({.min_p = 0.2}, kLogits, {}, SoftmaxOver(kLogits, {2, 3}), "min_p 0.2");
  // Temperature first, then top-k: the same kept set, flatter.
  ExpectDistribution({.temperature = 0.5, .top_k = 3}, kLogits, {}, SoftmaxOver(kLogits, {1, 2, 3}, 0.5),
                     "temperature then top_k");
}

TEST(TransformerSampler, TopKKeepsEveryTokenTiedWithTheKth) {
  const std::vector<float> tied = {1, 3, 3, 0};
  ExpectDistribution({.top_k = 1}, tied, {}, SoftmaxOver(tied, {1, 2}), "top_k 1 with a tie");
}

TEST(TransformerSampler, TheRepetitionPenaltyDividesPositiveAndMultipliesNegativeLogitsOfSeenTokens) {
  const std::vector<float> logits = {2, -1, 1, 0.5f};
  const std::vector<float> penalised = {1, -2, 1, 0.5f};  // tokens 0 and 1 seen (twice: once counts)
  ExpectDistribution({.repetition_penalty = 2}, logits, {0, 1, 1, 7, -3}, SoftmaxOver(penalised, {0, 1, 2, 3}),
                     "penalty 2");
}

TEST(TransformerSampler, GreedyTakesTheMostLikelyAndTheLowestIdOnATie) {
  Sampler greedy({.temperature = 0});
  EXPECT_EQ(*greedy.Next(kLogits, {}), 3);
  const std::vector<float> tied = {0, 5, 5, 1};
  EXPECT_EQ(*greedy.Next(tied, {}), 1);
  // After the penalty: 5 / 4 < 2.
  Sampler penalised({.temperature = 0, .repetition_penalty = 4});
  EXPECT_EQ(*penalised.Next(std::vector<float>{2, 5, 1}, std::vector<int32_t>{1}), 0);
}

TEST(TransformerSampler, ATemperatureTooSmallToDivideByIsGreedy) {
  Sampler tiny({.temperature = 1e-310});
  const std::vector<float> negative = {-3, -1, -2};
  EXPECT_EQ(*tiny.Next(negative, {}), 1);
}

TEST(TransformerSampler, DrawsFollowTheDistributionAndTheSeed) {
  const std::vector<float> logits = {std::log(0.1f), std::log(0.2f), std::log(0.7f)};
  Sampler sampler({.seed = 42});
  std::map<int32_t, int> counts;
  const int draws = 20000;
  std::vector<int32_t> first;
  for (int i = 0; i < draws; ++i) {
    const int32_t token = *sampler.Next(logits, {});
    counts[token]++;
    if (first.size() < 32) first.push_back(token);
  }
  EXPECT_NEAR(counts[0] / double(draws), 0.1, 0.01);
  EXPECT_NEAR(counts[1] / double(draws), 0.2, 0.01);
  EXPECT_NEAR(counts[2] / double(draws), 0.7, 0.01);

  Sampler again({.seed = 42}), other({.seed = 43});
  std::vector<int32_t> same, different;
  for (int i = 0; i < 32; ++i) {
    same.push_back(*again.Next(logits, {}));
    different.push_back(*other.Next(logits, {}));
  }
  EXPECT_EQ(same, first);
  EXPECT_NE(different, first);
}

TEST(TransformerSampler, NaNLogitsAreNeverChosenAndNoNumberAtAllIsAnError) {
  const std::vector<float> some_nan = {NAN, 1, NAN, 0};
  Sampler sampler({.seed = 1});
  for (int i = 0; i < 200; ++i) {
    const int32_t token = *sampler.Next(some_nan, {});
    EXPECT_TRUE(token == 1 || token == 3) << token;
  }
  const std::vector<float> all_nan = {NAN, NAN};
  Result<int32_t> none = sampler.Next(all_nan, {});
  EXPECT_EQ(none.status().code(), Code::kInternal);
  EXPECT_TRUE(Contains(none.status().message(), "no logit that is a number")) << none.status().message();
  const std::vector<float> minus_infinity = {-INFINITY, -INFINITY};
  EXPECT_EQ(sampler.Next(minus_infinity, {}).status().code(), Code::kInternal);
  // An infinite logit takes all the mass, shared among its equals.
  const std::vector<float> infinite = {0, INFINITY, 3, INFINITY};
  ExpectDistribution({}, infinite, {}, {0, 0.5, 0, 0.5}, "two +inf logits");
  ExpectDistribution({.top_p = 0.3}, infinite, {}, {0, 0, 0, 1}, "top_p over +inf logits keeps the last");
}

// Greedy decoding with no penalty chooses by ArgMaxToken alone (on a GPU, on the device): the same
// token as the sampler's greedy choice, and the same error, for every kind of logits.
TEST(TransformerSampler, TheArgMaxIsTheGreedyChoiceForEveryKindOfLogits) {
  const std::vector<std::vector<float>> cases = {
      {0.5f, 2, -1, 2}, {NAN, 1, NAN, 0}, {-INFINITY, -3, -INFINITY}, {0, INFINITY, 3, INFINITY},
      {-INFINITY, NAN, 7}, {NAN, NAN}, {-INFINITY, -INFINITY}, {1e30f, -1e30f, 1e30f}, {-0.0f, 0.0f}};
  for (const std::vector<float>& logits : cases) {
    Sampler greedy({.temperature = 0});
    Result<int32_t> want = greedy.Next(logits, {});
    Result<int32_t> got = ArgMaxToken(logits);
    ASSERT_EQ(got.ok(), want.ok()) << fmt::format("{}", fmt::join(logits, ", "));
    if (want.ok()) {
      EXPECT_EQ(*got, *want) << fmt::format("{}", fmt::join(logits, ", "));
    } else {
      EXPECT_EQ(got.status().code(), Code::kInternal);
    }
  }
  EXPECT_TRUE(ChoosesArgMax({.temperature = 0}));
  EXPECT_TRUE(ChoosesArgMax({.temperature = 1e-6}));
  EXPECT_FALSE(ChoosesArgMax({.temperature = 0.7}));
  EXPECT_FALSE(ChoosesArgMax({.temperature = 0, .repetition_penalty = 1.1}));
}

TEST(TransformerSampler, OptionsOutOfRangeAreRefusedByName) {
  struct Bad {
    SamplingOptions options;
    const char* named;
  };
  const Bad bad[] = {
      {{.temperature = -1}, "temperature"},
      {{.temperature = NAN}, "temperature"},
      {{.temperature = INFINITY}, "temperature"},
      {{.top_p = 0}, "top_p"},
      {{.top_p = 1.5}, "top_p"},
      {{.top_p = NAN}, "top_p"},
      {{.min_p = -0.1}, "min_p"},
      {{.min_p = 2}, "min_p"},
      {{.min_p = NAN}, "min_p"},
      {{.repetition_penalty = 0}, "repetition_penalty"},
      {{.repetition_penalty = -1}, "repetition_penalty"},
      {{.repetition_penalty = INFINITY}, "repetition_penalty"},
  };
  for (const Bad& b : bad) {
    Status s = CheckSamplingOptions(b.options);
    EXPECT_EQ(s.code(), Code::kInvalidArgument) << b.named;
    EXPECT_TRUE(Contains(s.message(), b.named)) << s.message();
  }
  EXPECT_TRUE(CheckSamplingOptions({}).ok());
  EXPECT_TRUE(CheckSamplingOptions({.temperature = 0, .top_k = 1, .top_p = 1, .min_p = 1}).ok());
}

}  // namespace
}  // namespace warmpool::transformer
