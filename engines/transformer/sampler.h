// Choosing the next token from a model's logits, as Hugging Face's generate() does with the same
// options, in its order: the repetition penalty on the logits of tokens already in the sequence,
// then temperature, top-k, top-p and min-p, then a draw from what is left (or the most likely
// token, when the temperature is 0).
//
// The draw comes from a generator seeded by the request: the same seed, logits and options give
// the same token, on any machine (the uniform is made from the generator's raw bits, not by a
// standard library's distribution).
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "common/status.h"

namespace warmpool::transformer {

struct SamplingOptions {
  double temperature = 1.0;         // 0 (or below 1e-5): greedy (the most likely; the lowest id on a tie)
  uint32_t top_k = 0;               // keep the k most likely (and any tied with the k-th); 0: all
  double top_p = 1.0;               // keep the fewest most likely tokens holding at least p; 1: all
  double min_p = 0.0;               // drop tokens less likely than min_p x the most likely; 0: none
  double repetition_penalty = 1.0;  // a seen token's logit: divided if positive, multiplied if not
  uint64_t seed = 0;
};

// INVALID_ARGUMENT naming the option when one is out of its range (NaN, infinite, negative, ...).
Status CheckSamplingOptions(const SamplingOptions& options);

// Whether these options choose the most likely token whatever came before: greedy, with no
// repetition penalty. Next then is the logits' argmax (ArgMaxToken), which a GPU finds on the device
// without copying the logits back (Sequence::ForwardArgMax).
bool ChoosesArgMax(const SamplingOptions& options);
// The token Next chooses greedily with no penalty: the largest logit (NaN and -inf impossible; the
// lowest id on a tie). INTERNAL when none is possible.
Result<int32_t> ArgMaxToken(std::span<const float> logits);

class Sampler {
 public:
  // options must have passed CheckSamplingOptions.
  explicit Sampler(const SamplingOptions& options);

  // The next token. logits: the model's, one per vocabulary entry (not changed); seen: the
  // sequence so far (prompt and generated tokens), for the repetition penalty. NaN logits count
  // as impossible; when no logit is a number the model is broken: INTERNAL.
  Result<int32_t> Next(std::span<const float> logits, std::span<const int32_t> seen);
  // Where `tokens` calls of Next would have left it: past their draws (one per sampled token, none
  // when greedy). A resumed generation's sampler, after the tokens it had generated.
  void Skip(uint64_t tokens) {
    if (options_.temperature >= 1e-5) generator_.discard(tokens);
  }

  // The distribution Next draws from: every filter applied, normalised (all zero but the chosen
  // token's when greedy). For tests and for logprobs.
  Result<std::vector<double>> Distribution(std::span<const float> logits, std::span<const int32_t> seen) const;

 private:
  SamplingOptions options_;
  std::mt19937_64 generator_;
};

}  // namespace warmpool::transformer
