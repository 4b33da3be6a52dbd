#include "engines/transformer/step_pacer.h"

#include <algorithm>
#include <cmath>

namespace warmpool::transformer {

namespace {

// The weight of the newest decode step in its moving average: a few steps follow a change, and one
// step the machine's noise stretched (counted as twice the average at most) moves it by 30 %.
constexpr double kNewest = 0.3;
// A step past the bound cuts the piece to this share of itself.
constexpr double kCut = 0.75;

}  // namespace

uint32_t StepPacer::PromptBudget(bool decoding) const {
  if (!decoding) return most_alone_;
  if (decode_seconds_ == 0 || since_decode_ + 1 >= kProbeEvery) return 0;  // a step that measures the decode
  return piece();
}

void StepPacer::Observe(uint32_t prompt_tokens, bool decoding, double seconds) {
  if (!decoding || !std::isfinite(seconds) || seconds <= 0) return;
  if (prompt_tokens == 0) {
    since_decode_ = 0;
    if (decode_seconds_ == 0) decode_seconds_ = seconds;
    else decode_seconds_ += kNewest * (std::min(seconds, 2 * decode_seconds_) - decode_seconds_);
    return;
  }
  since_decode_++;
  if (decode_seconds_ == 0) return;  // nothing to measure it against yet
  if (seconds > bound_ * decode_seconds_) {
    piece_ = std::max(1.0, piece_ * kCut);
  } else if (prompt_tokens >= PromptBudget(true)) {
    piece_ = std::min<double>(most_beside_decode_, piece_ + 1);
  }
}

}  // namespace warmpool::transformer
