// How many prompt tokens a step may carry beside sequences that decode (chunked prefill), chosen so
// that a step stays within kStepLatencyRatio of a step that only decodes: the streams running see
// their gaps between tokens stretch by that much at most while a long prompt goes in, and the
// prompt goes in as fast as that allows.
//
// Why measured and not a fixed piece: what a prompt token costs depends on the machine (a product
// of many rows runs at the arithmetic's pace, a decode step at the memory's) and grows with its
// position (its attention reads every earlier one). A fixed 32-token piece costs about ten decode
// steps at position 2000 on a 2-core machine, and a handful where the arithmetic is plentiful. So
// the pacer times the steps: those that only decode give the decode step's time, those that carry
// prompt tokens the cost of one more token; each is a moving average, so a cost that grows as the
// prompt goes on is followed within a few steps.
#pragma once

#include <cstdint>

namespace warmpool::transformer {

// A step with prompt tokens beside decoding sequences takes at most this many times a step without.
inline constexpr double kStepLatencyRatio = 2.5;

class StepPacer {
 public:
  // At most this many prompt tokens a step, decoding or not (the caller's piece sizes).
  StepPacer(uint32_t most_beside_decode, uint32_t most_alone)
      : most_beside_decode_(most_beside_decode), most_alone_(most_alone) {}

  // Prompt tokens the next step may carry: most_alone with no sequence decoding; beside decoding
  // ones, as many as the measured costs say fit within kStepLatencyRatio of a decode step (at least
  // one, so that a prompt always goes on; before anything is measured, a quarter of the most).
  uint32_t PromptBudget(bool decoding) const;

  // A step took `seconds`: it carried `prompt_tokens` of prompts, and sequences decoded in it or not.
  // Steps with prompts and no decode say nothing (nobody waits on them); a time that is not a
  // positive finite number is ignored.
  void Observe(uint32_t prompt_tokens, bool decoding, double seconds);

  double decode_seconds() const { return decode_seconds_; }
  double token_seconds() const { return token_seconds_; }

 private:
  uint32_t most_beside_decode_;
  uint32_t most_alone_;
  double decode_seconds_ = 0;  // a step that only decodes; 0: none seen yet
  double token_seconds_ = 0;   // one prompt token more in a decoding step; 0: none seen yet
};

}  // namespace warmpool::transformer
