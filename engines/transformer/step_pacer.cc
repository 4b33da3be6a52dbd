#include "engines/transformer/step_pacer.h"

#include <algorithm>
#include <cmath>

namespace warmpool::transformer {

namespace {

// The weight of the newest step in a moving average: a few steps follow a change, and one step the
// machine's noise stretched moves it a little.
constexpr double kNewest = 0.3;

double Averaged(double average, double sample) {
  return average == 0 ? sample : average + kNewest * (sample - average);
}

}  // namespace

uint32_t StepPacer::PromptBudget(bool decoding) const {
  if (!decoding) return most_alone_;
  if (decode_seconds_ == 0 || token_seconds_ == 0) return std::max(1u, most_beside_decode_ / 4);
  const double fits = (kStepLatencyRatio - 1) * decode_seconds_ / token_seconds_;
  if (!(fits >= 1)) return 1;  // NaN too: a prompt always goes on
  return static_cast<uint32_t>(std::min<double>(fits, most_beside_decode_));
}

void StepPacer::Observe(uint32_t prompt_tokens, bool decoding, double seconds) {
  if (!decoding || !std::isfinite(seconds) || seconds <= 0) return;
  if (prompt_tokens == 0) {
    decode_seconds_ = Averaged(decode_seconds_, seconds);
    return;
  }
  if (decode_seconds_ == 0) return;  // the decode's share of it is not known yet
  // What the prompt tokens added to the decode; a step the noise made shorter than a decode step
  // says they cost little, never nothing (the budget would be unbounded).
  const double added = std::max(seconds - decode_seconds_, 0.01 * decode_seconds_);
  token_seconds_ = Averaged(token_seconds_, added / prompt_tokens);
}

}  // namespace warmpool::transformer
