// Text in, text out: a request's prompt tokenized, its tokens generated (engines/transformer/
// generation.h) and streamed back as text that never splits a UTF-8 character, cut before the
// first stop string. What the transformer engine's generate call runs.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "engines/transformer/sequence.h"
#include "engines/transformer/generation.h"
#include "engines/transformer/model_directory.h"
#include "engines/transformer/sampler.h"

namespace warmpool::transformer {

struct TextRequest {
  std::string prompt;           // tokenized with the tokenizer's special tokens (its BOS) ...
  bool add_special_tokens = true;  // ... unless it is a rendered chat, which has them already
  std::vector<int32_t> tokens;  // ... unless token ids are given (used as they are)
  uint32_t max_tokens = 0;      // 0: until an end token or the end of the context
  SamplingOptions sampling;     // complete: the model's defaults already merged in
  std::vector<std::string> stop;
  bool logprobs = false;        // each token's log-probability with it (generation.h) ...
  uint32_t top_logprobs = 0;    // ... and the most likely tokens' at its step
  std::vector<int32_t> resumed; // a resumed generation's tokens so far (GenerationRequest::resumed)
};

struct TextResult {
  FinishReason finish = FinishReason::kLength;
  uint32_t prompt_tokens = 0;
  uint32_t completion_tokens = 0;
};

// Called once per generated token with the text it completes (possibly empty) and, when asked for,
// its log-probabilities; once more at the end with the text held back and no token, when there is
// any. Between the pieces of a long prompt it is called with no text and no token: progress,
// nothing to send. Returning false cancels.
using EmitFn = std::function<bool(std::string_view text, std::span<const int32_t> tokens,
                                  std::span<const TokenLogprobs> logprobs)>;

// INVALID_ARGUMENT before anything runs: an empty prompt, one that leaves no room in the cache's
// context, a token outside the vocabulary, options out of range.
Result<TextResult> GenerateText(Sequence& model, const ServingFiles& files, const TextRequest& request,
                                const EmitFn& emit);

}  // namespace warmpool::transformer
