// How many prompt tokens a step may carry beside sequences that decode (chunked prefill), steered so
// that a step stays about kStepLatencyRatio of a step that only decodes: the streams running see
// their gaps between tokens stretch by about that much while a long prompt goes in (a step now and
// then goes one token past it, as the piece probes for room), and the prompt goes in as fast as
// that allows.
//
// Why measured and not a fixed piece: what prompt tokens cost depends on the machine (a product of
// many rows runs at the arithmetic's pace, a decode step at the memory's), on their position (their
// attention reads every earlier one), and not in proportion to their number (a step of two rows
// takes another kernel than a step of one, and a piece of several shares its attention's reads). A
// fixed 32-token piece costs about ten decode steps at position 2000 on a 2-core machine, and a
// handful where the arithmetic is plentiful. So the pacer times the steps, and steers the piece the
// way TCP steers its window: a step that stayed within the bound lets the next carry one token
// more, one that went past it cuts the piece by a quarter. The decode step it measures against is a
// moving average of the steps that carry no prompt; while prompts wait, every kProbeEvery-th step
// carries none (they sit it out), so that the average is of steps like the ones it judges — the
// same sequences decoding at the same positions — and not of what ran before.
#pragma once

#include <algorithm>
#include <cstdint>

namespace warmpool::transformer {

// A step with prompt tokens beside decoding sequences is steered to take at most this many times a
// step without, unless the model's settings say otherwise ([[models]] prefill_stretch, from
// kMinStepLatencyRatio to kMaxStepLatencyRatio).
inline constexpr double kStepLatencyRatio = 2.0;
inline constexpr double kMinStepLatencyRatio = 1.0;
inline constexpr double kMaxStepLatencyRatio = 100.0;
// Beside decoding sequences, one step in this many carries no prompt token: the decode step measured.
inline constexpr uint32_t kProbeEvery = 16;

class StepPacer {
 public:
  // At most this many prompt tokens a step, decoding or not (the caller's piece sizes); a step with
  // prompt tokens beside a decode kept within `bound` times a step without (clamped to the range
  // above; not a number: the default).
  StepPacer(uint32_t most_beside_decode, uint32_t most_alone, double bound = kStepLatencyRatio)
      : most_beside_decode_(std::max(1u, most_beside_decode)),
        most_alone_(std::max(1u, most_alone)),
        bound_(bound == bound ? std::clamp(bound, kMinStepLatencyRatio, kMaxStepLatencyRatio) : kStepLatencyRatio),
        piece_(std::max(1u, most_beside_decode / 4)) {}

  // Prompt tokens the next step may carry: most_alone with no sequence decoding; beside decoding
  // ones, the piece steered so far (at least one, so that a prompt always goes on), but none in a
  // step that measures the decode (every kProbeEvery-th, and while no decode step was seen).
  uint32_t PromptBudget(bool decoding) const;

  // A step took `seconds`: it carried `prompt_tokens` of prompts, and sequences decoded in it or not.
  // Steps with prompts and no decode say nothing (nobody waits on them); a time that is not a
  // positive finite number is ignored. A step that carried fewer prompt tokens than the piece (a
  // prompt's last) and stayed within the bound says nothing of the piece either. A decode step
  // longer than twice the average counts as twice it (one the machine's noise stretched).
  void Observe(uint32_t prompt_tokens, bool decoding, double seconds);

  double decode_seconds() const { return decode_seconds_; }
  double bound() const { return bound_; }
  // The piece as steered: what a step beside decoding sequences carries but for the probes.
  uint32_t piece() const { return std::clamp(static_cast<uint32_t>(piece_), 1u, most_beside_decode_); }

 private:
  uint32_t most_beside_decode_;
  uint32_t most_alone_;
  double bound_;
  double piece_;               // prompt tokens beside a decode, as steered
  double decode_seconds_ = 0;  // a step that only decodes; 0: none seen yet
  uint32_t since_decode_ = 0;  // steps with prompts beside a decode since the last without
};

}  // namespace warmpool::transformer
