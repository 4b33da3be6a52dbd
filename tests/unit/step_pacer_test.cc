// The pacer of chunked prefill (engines/transformer/step_pacer.h): beside decoding sequences, the
// prompt tokens a step carries are steered by the steps' times — one more after a step within
// kStepLatencyRatio of a decode step, a quarter fewer after one past it — so that they settle where
// a step's cost meets the bound, whatever the costs' shape; every kProbeEvery-th step carries none,
// so that the decode step judged against is of now; alone, a whole piece. Times that are not times
// are ignored.
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

// Steps the pacer `steps` times on that cost: how many steps went past 1.2 times the bound, and
// the piece at the end.
struct Steered {
  uint32_t over = 0;
  uint32_t budget = 0;
};
Steered Steer(StepPacer& pacer, int steps, double fixed, double each) {
  Steered run;
  for (int i = 0; i < steps; ++i) {
    const uint32_t budget = pacer.PromptBudget(true);
    const double seconds = StepSeconds(budget, fixed, each);
    run.over += seconds > pacer.bound() * pacer.decode_seconds() * 1.2 ? 1 : 0;
    pacer.Observe(budget, true, seconds);
    run.budget = pacer.piece();
  }
  return run;
}

TEST(StepPacerTest, BesideADecodeThePieceSettlesWhereAStepMeetsTheBound) {
  StepPacer pacer(32, 256);
  EXPECT_EQ(pacer.PromptBudget(false), 256u) << "nobody decodes: a whole piece";
  EXPECT_EQ(pacer.PromptBudget(true), 0u) << "a decode step is measured first";
  pacer.Observe(8, true, 0.5);
  EXPECT_EQ(pacer.PromptBudget(true), 0u) << "no decode step to measure against yet";
  for (int i = 0; i < 20; ++i) pacer.Observe(0, true, 0.016);
  EXPECT_NEAR(pacer.decode_seconds(), 0.016, 1e-9);
  EXPECT_EQ(pacer.PromptBudget(true), 8u) << "then a quarter of the most";
  // Affine costs: 6 ms to carry any, 2 ms a token. The bound, 32 ms, fits 5 tokens (32 ms).
  static_assert(kStepLatencyRatio == 2.0, "the figures below are for a bound of twice a decode step");
  Steer(pacer, 200, 0.006, 0.002);
  uint32_t lowest = 32, highest = 0;
  for (int i = 0; i < 100; ++i) {
    Steered r = Steer(pacer, 1, 0.006, 0.002);
    lowest = std::min(lowest, r.budget);
    highest = std::max(highest, r.budget);
  }
  EXPECT_GE(lowest, 4u);
  EXPECT_LE(highest, 6u) << "around 5, one past the bound at most";
  // Where the arithmetic is plentiful (0.2 ms a token, nothing fixed): the most beside a decode.
  Steer(pacer, 100, 0, 0.0002);
  EXPECT_EQ(pacer.piece(), 32u);
  // A cost that alone busts the bound: a token a step, so that the prompt still goes on.
  Steer(pacer, 100, 0.05, 0.002);
  EXPECT_EQ(pacer.piece(), 1u);
}

// A decode step measured on other work (fewer sequences, shorter positions, before an idle spell)
// would judge every step with a prompt too long and pin the piece at one token: the probes measure
// the decode as it is now, and the piece recovers.
TEST(StepPacerTest, ProbesKeepTheDecodeStepJudgedAgainstOfNow) {
  StepPacer pacer(32, 256);
  for (int i = 0; i < 10; ++i) pacer.Observe(0, true, 0.005);  // 5 ms: one short sequence, earlier
  uint32_t probes = 0;
  for (int i = 0; i < 64; ++i) {
    const uint32_t budget = pacer.PromptBudget(true);
    probes += budget == 0;
    pacer.Observe(budget, true, StepSeconds(budget, 0.005, 0.001));
  }
  EXPECT_EQ(probes, 64 / kProbeEvery) << "one step in kProbeEvery carries no prompt";
  EXPECT_GT(pacer.decode_seconds(), 0.012) << "the decode of now (16 ms) measured";
  Steer(pacer, 300, 0.005, 0.001);  // (32 - 21) / 1 = 11 fit
  EXPECT_GE(pacer.piece(), 8u);
  // A decode step the noise stretched tenfold moves the average by 30 % of twice it, not tenfold.
  const double before = pacer.decode_seconds();
  pacer.Observe(0, true, 10 * before);
  EXPECT_NEAR(pacer.decode_seconds(), 1.3 * before, 1e-9);
}

// [[models]] prefill_stretch: a looser bound lets more of a prompt in a step, a tighter one less;
// out of range is clamped, not a number is the default.
TEST(StepPacerTest, TheBoundIsTheModelsToChoose) {
  auto settled = [](double bound) {
    StepPacer pacer(32, 256, bound);
    for (int i = 0; i < 10; ++i) pacer.Observe(0, true, 0.016);
    Steer(pacer, 300, 0.006, 0.002);  // affine costs, as above: (bound - 1) x 16 ms - 6 ms fit
    uint32_t highest = 0;
    for (int i = 0; i < 50; ++i) highest = std::max(highest, Steer(pacer, 1, 0.006, 0.002).budget);
    return highest;
  };
  EXPECT_LE(settled(2.0), 6u);
  const uint32_t loose = settled(3.0);  // 32 ms - 6 ms: 13 tokens
  EXPECT_GE(loose, 12u);
  EXPECT_LE(loose, 14u);
  EXPECT_EQ(settled(1.0), 1u) << "no stretch: a token a step, so that the prompt still goes on";
  EXPECT_EQ(StepPacer(32, 256, 0.5).bound(), kMinStepLatencyRatio);
  EXPECT_EQ(StepPacer(32, 256, 1e9).bound(), kMaxStepLatencyRatio);
  EXPECT_EQ(StepPacer(32, 256, std::nan("")).bound(), kStepLatencyRatio);
}

TEST(StepPacerTest, ACostThatGrowsWithThePromptsPositionIsFollowed) {
  StepPacer pacer(32, 256);
  for (int i = 0; i < 10; ++i) pacer.Observe(0, true, 0.016);
  Steer(pacer, 100, 0.005, 0.001);  // early positions: (32 - 21) / 1 = 11 fit
  EXPECT_GE(pacer.piece(), 9u);
  Steered later = Steer(pacer, 30, 0.005, 0.004);  // the same prompt 1500 positions on: 2 fit
  EXPECT_LE(later.budget, 5u);
  EXPECT_LE(later.over, 12u) << "a few steps past the bound while the piece comes down";
}

TEST(StepPacerTest, TimesThatAreNotTimesAndStepsNobodyWaitsOnChangeNothing) {
  StepPacer pacer(32, 256);
  for (int i = 0; i < 10; ++i) pacer.Observe(0, true, 0.010);
  const double decode = pacer.decode_seconds();
  const uint32_t budget = pacer.PromptBudget(true);
  ASSERT_EQ(budget, 8u);
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
