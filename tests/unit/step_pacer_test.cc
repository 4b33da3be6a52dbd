// The pacer of chunked prefill (engines/transformer/step_pacer.h): beside decoding sequences, a step
// carries as many prompt tokens as keep it within kStepLatencyRatio of a decode step, by the times
// it was told; alone, a whole piece. Times that are not times are ignored.
#include "engines/transformer/step_pacer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace warmpool::transformer {
namespace {

TEST(StepPacerTest, BesideADecodeAStepStaysWithinTheRatioOfADecodeStep) {
  StepPacer pacer(32, 256);
  EXPECT_EQ(pacer.PromptBudget(false), 256u) << "nobody decodes: a whole piece";
  EXPECT_EQ(pacer.PromptBudget(true), 8u) << "nothing measured yet: a quarter of the most";
  for (int i = 0; i < 20; ++i) pacer.Observe(0, true, 0.016);
  EXPECT_NEAR(pacer.decode_seconds(), 0.016, 1e-9);
  EXPECT_EQ(pacer.PromptBudget(true), 8u) << "a prompt token's cost not measured yet";
  // 8 prompt tokens made a step of 160 ms: 18 ms a token; 1.5 decode steps fit 1 of them.
  for (int i = 0; i < 20; ++i) pacer.Observe(8, true, 0.016 + 8 * 0.018);
  EXPECT_NEAR(pacer.token_seconds(), 0.018, 1e-6);
  EXPECT_EQ(pacer.PromptBudget(true), 1u);
  // Where the arithmetic is plentiful (0.5 ms a token): 48, held to the most beside a decode.
  for (int i = 0; i < 30; ++i) pacer.Observe(4, true, 0.016 + 4 * 0.0005);
  EXPECT_EQ(pacer.PromptBudget(true), 32u);
  // In between (2.9 ms a token): 1.5 x 16 / 2.9 = 8.3.
  for (int i = 0; i < 40; ++i) pacer.Observe(10, true, 0.016 + 10 * 0.0029);
  EXPECT_EQ(pacer.PromptBudget(true), 8u);
  // The step's time with its budget: within the ratio.
  const double step = pacer.decode_seconds() + pacer.PromptBudget(true) * pacer.token_seconds();
  EXPECT_LE(step, kStepLatencyRatio * pacer.decode_seconds() + 1e-9);
}

TEST(StepPacerTest, ACostThatGrowsIsFollowedWithinAFewSteps) {
  StepPacer pacer(32, 256);
  for (int i = 0; i < 10; ++i) pacer.Observe(0, true, 0.010);
  for (int i = 0; i < 10; ++i) pacer.Observe(5, true, 0.010 + 5 * 0.001);
  const uint32_t before = pacer.PromptBudget(true);
  EXPECT_GE(before, 14u);  // 1.5 x 10 / 1 = 15, to the rounding of the times
  EXPECT_LE(before, 15u);
  for (int i = 0; i < 6; ++i) pacer.Observe(5, true, 0.010 + 5 * 0.003);  // a prompt's later positions
  EXPECT_LE(pacer.PromptBudget(true), 6u);
  EXPECT_GE(pacer.PromptBudget(true), 5u);
}

TEST(StepPacerTest, TimesThatAreNotTimesAndStepsNobodyWaitsOnChangeNothing) {
  StepPacer pacer(32, 256);
  for (int i = 0; i < 10; ++i) pacer.Observe(0, true, 0.010);
  for (int i = 0; i < 10; ++i) pacer.Observe(5, true, 0.020);
  const double decode = pacer.decode_seconds(), token = pacer.token_seconds();
  for (double bad : {std::nan(""), std::numeric_limits<double>::infinity(), -1.0, 0.0}) {
    pacer.Observe(0, true, bad);
    pacer.Observe(7, true, bad);
  }
  pacer.Observe(100, false, 5.0);  // a prompt alone: no stream waited on it
  EXPECT_EQ(pacer.decode_seconds(), decode);
  EXPECT_EQ(pacer.token_seconds(), token);
  // A step the noise made shorter than a decode: the tokens cost little, the budget stays bounded.
  for (int i = 0; i < 30; ++i) pacer.Observe(3, true, 0.001);
  EXPECT_EQ(pacer.PromptBudget(true), 32u);
  EXPECT_GE(pacer.PromptBudget(true), 1u);
  // Before any decode step: a prompt token's cost cannot be told from the decode's.
  StepPacer fresh(32, 256);
  fresh.Observe(8, true, 0.5);
  EXPECT_EQ(fresh.token_seconds(), 0.0);
}

}  // namespace
}  // namespace warmpool::transformer
