// One sequence's generation, on the CPU or a GPU (engines/transformer/sequence.h): the prompt in one forward pass, then a token at a time
// until an end token, the token limit, the end of the context, or the caller's stop.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <utility>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "engines/transformer/cpu_model.h"
#include "engines/transformer/sampler.h"
#include "engines/transformer/sequence.h"

namespace warmpool::transformer {

enum class FinishReason {
  kStop,       // an end token was chosen (it is not part of the output)
  kLength,     // max_tokens were generated, or the context is full
  kCancelled,  // the caller's on_token said to stop
};
std::string_view FinishReasonName(FinishReason reason);  // "stop", "length", "cancelled"

struct GenerationRequest {
  std::vector<int32_t> prompt;
  uint32_t max_tokens = 16;
  SamplingOptions sampling;
  std::vector<int32_t> end_tokens;  // the model's eos tokens (generation_config.json)
  // A generation resumed after its worker died: the tokens it had generated (its client has them).
  // They are computed with the prompt and count as generated; the sampler is past their draws.
  std::vector<int32_t> resumed;
  bool logprobs = false;            // each token's log-probability to on_logprobs ...
  uint32_t top_logprobs = 0;        // ... and this many most likely tokens' (at most kMaxTopLogprobs)
};

inline constexpr uint32_t kMaxTopLogprobs = 20;

// A chosen token's log-probability under the model's own distribution — the log-softmax of its
// logits, before temperature, penalties and filters: what the model says, not how the sampler
// drew — and the most likely tokens' at that step, most likely first (ties: the lower id).
// NaN logits count as impossible (-inf), as the sampler counts them.
struct TokenLogprobs {
  int32_t token = 0;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;
};
TokenLogprobs LogprobsOf(std::span<const float> logits, int32_t chosen, uint32_t top);

struct Generation {
  std::vector<int32_t> tokens;  // generated, end token excluded
  FinishReason finish = FinishReason::kLength;
  uint32_t prompt_tokens = 0;
};

// A prompt runs through the model this many tokens at a time: between pieces on_progress is called,
// so that a long prompt shows it moves (a worker would otherwise be taken for hung) and can be
// cancelled before its end. Each piece attends to the cache of the ones before: the same logits.
inline constexpr uint32_t kPrefillPiece = 256;

// on_token: called with each generated token as it is chosen; returning false cancels. Checked
// once per decode step, and on_progress between a prompt's pieces: a cancelled generation stops
// within one step or piece. The sequence's cache starts
// empty (whatever it held is overwritten); errors (a prompt that does not fit, bad options, a
// token outside the vocabulary) are INVALID_ARGUMENT before anything runs.
// With request.logprobs, on_logprobs gets each token's just before on_token gets the token.
Result<Generation> Generate(Sequence& sequence, const GenerationRequest& request,
                            const std::function<bool(int32_t)>& on_token = nullptr,
                            const std::function<bool()>& on_progress = nullptr,
                            const std::function<void(const TokenLogprobs&)>& on_logprobs = nullptr);

// The same on the CPU, with the model and a cache.
inline Result<Generation> Generate(CpuModel& model, KvCache& cache, const GenerationRequest& request,
                                   const std::function<bool(int32_t)>& on_token = nullptr) {
  CpuSequence sequence(model, cache);
  return Generate(sequence, request, on_token);
}

}  // namespace warmpool::transformer
