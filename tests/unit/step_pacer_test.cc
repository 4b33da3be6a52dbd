// The pacer of chunked prefill (engines/transformer/step_pacer.h): beside decoding sequences, the
// prompt tokens a step carries are steered by the steps' times — one more after a step within
// kStepLatencyRatio of a decode step, a quarter fewer after one past it — so that they settle where
// a step's cost meets the bound, whatever the costs' shape; alone, a whole piece. Times that are not
// times are ignored.
#include "engines/transformer/step_pacer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace warmpool::transformer {
namespace {

// A step of `tokens` prompt tokens beside a 16 ms decode: a fixed cost for carrying any (another
// kernel), and each token's own.
double StepSeconds(uint32_t tokens, double fixed, double each) {
  return 0.016 + (tokens > 0 ? fixed + tokens * each : 0);
}

// Steps the pacer `steps` times on that cost; the most steps went past the bound in a row, and how
// many did in all.
struct Steered {
  uint32_t over = 0;
  uint32_t budget = 0;
};
Steered Steer(StepPacer& pacer, int steps, double fixed, double each) {
  Steered run;
  for (int i = 0; i < steps; ++i) {
    const uint32_t budget = pacer.PromptBudget(true);
    const double seconds = StepSeconds(budget, fixed, each);
    run.over += seconds > kStepLatencyRatio * pacer.decode_seconds() * 1.2 ? 1 : 0;
    pacer.Observe(budget, true, seconds);
    run.budget = pacer.PromptBudget(true);
  }
  return run;
}

TEST(StepPacerTest, BesideADecodeThePieceSettlesWhereAStepMeetsTheBound) {
  StepPacer pacer(32, 256);
  EXPECT_EQ(pacer.PromptBudget(false), 256u) << "nobody decodes: a whole piece";
  EXPECT_EQ(pacer.PromptBudget(true), 8u) << "before anything is measured: a quarter of the most";
  pacer.Observe(8, true, 0.5);
  EXPECT_EQ(pacer.PromptBudget(true), 8u) << "no decode step to measure against yet";
  for (int i = 0; i < 20; ++i) pacer.Observe(0, true, 0.016);
  EXPECT_NEAR(pacer.decode_seconds(), 0.016, 1e-9);
  // Affine costs: 13 ms to carry any, 2 ms a token. The bound, 40 ms, fits 5 tokens (39 ms).
  Steer(pacer, 200, 0.013, 0.002);
  uint32_t lowest = 32, highest = 0;
  for (int i = 0; i < 100; ++i) {
    Steered r = Steer(pacer, 1, 0.013, 0.002);
    lowest = std::min(lowest, r.budget);
    highest = std::max(highest, r.budget);
  }
  EXPECT_GE(lowest, 4u);
  EXPECT_LE(highest, 6u) << "around 5, one past the bound at most";
  // Where the arithmetic is plentiful (0.2 ms a token, nothing fixed): the most beside a decode.
  Steer(pacer, 100, 0, 0.0002);
  EXPECT_EQ(pacer.PromptBudget(true), 32u);
  // A cost that alone busts the bound: a token a step, so that the prompt still goes on.
  Steer(pacer, 100, 0.05, 0.002);
  EXPECT_EQ(pacer.PromptBudget(true), 1u);
}

TEST(StepPacerTest, ACostThatGrowsWithThePromptsPositionIsFollowed) {
  StepPacer pacer(32, 256);
  for (int i = 0; i < 10; ++i) pacer.Observe(0, true, 0.016);
  Steer(pacer, 100, 0.005, 0.001);  // early positions: (40 - 21) / 1 = 19 fit
  EXPECT_GE(pacer.PromptBudget(true), 15u);
  Steered later = Steer(pacer, 30, 0.005, 0.004);  // the same prompt 1500 positions on: 4 fit
  EXPECT_LE(later.budget, 5u);
  EXPECT_LE(later.over, 12u) << "a few steps past the bound while the piece comes down";
}

TEST(StepPacerTest, TimesThatAreNotTimesAndStepsNobodyWaitsOnChangeNothing) {
  StepPacer pacer(32, 256);
  for (int i = 0; i < 10; ++i) pacer.Observe(0, true, 0.010);
  const double decode = pacer.decode_seconds();
  const uint32_t budget = pacer.PromptBudget(true);
  for (double bad : {std::nan(""), std::numeric_limits<double>::infinity(), -1.0, 0.0}) {
    pacer.Observe(0, true, bad);
    pacer.Observe(budget, true, bad);
  }
  pacer.Observe(100, false, 5.0);  // a prompt alone: no stream waited on it
  EXPECT_EQ(pacer.decode_seconds(), decode);
  EXPECT_EQ(pacer.PromptBudget(true), budget);
  // A prompt's last tokens, fewer than the piece, within the bound: nothing said of the piece.
  pacer.Observe(budget - 1, true, 0.011);
  EXPECT_EQ(pacer.PromptBudget(true), budget);
  pacer.Observe(budget, true, 0.011);
  EXPECT_EQ(pacer.PromptBudget(true), budget + 1);
}

}  // namespace
}  // namespace warmpool::transformer
