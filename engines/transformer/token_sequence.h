// One generation's way through its tokens, as a step drives it: its prompt in pieces, then a token
// at a time, until an end token, the token limit, the end of the context, or its caller's end.
// The sequence itself runs nothing: each step asks it what to feed (Next), runs that with other
// sequences' tokens in one pass of the model (engines/transformer/sequence_slots.h), and hands back
// the logits of the last token fed (Advance). Driving one sequence alone, step after step, is the
// generation Generate (generation.h) runs; driving several in one step is continuous batching. Both
// choose the same tokens: a sequence's sampler, its seen tokens and its position are its own.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "common/status.h"
#include "engines/transformer/generation.h"

namespace warmpool::transformer {

class TokenSequence {
 public:
  // INVALID_ARGUMENT before anything runs: an empty prompt, one that leaves no room in a context of
  // `context` positions, a token outside the vocabulary, options out of range, resumed tokens that
  // could not have been generated (an end token, past the context). A resumed generation that had
  // already reached its limit starts ended.
  static Result<TokenSequence> Start(GenerationRequest request, uint32_t context, uint32_t vocab_size);

  // What its next step runs: tokens at positions start, start + 1, ... (the cache holds the
  // positions before start). A prompt (and a resumed generation's tokens after it) goes in pieces
  // of at most `budget` tokens (>= 1); after it, one token a step. `chooses`: the step's logits for the last token choose the next token.
  struct Feed {
    std::span<const int32_t> tokens;
    uint32_t start = 0;
    bool chooses = false;
  };
  Feed Next(uint32_t budget) const;

  // Before its first step: the cache already holds the first `cached` of the tokens to prefill (a
  // prefix kept from an earlier sequence), which it then does not feed. Fewer than all of them.
  void Skip(uint32_t cached);
  uint32_t cached_tokens() const { return cached_; }
  // What goes in before its first choice: the prompt, and a resumed generation's tokens.
  std::span<const int32_t> prefill() const { return std::span<const int32_t>(seen_).first(prefill_tokens_); }
  uint32_t prefill_tokens() const { return prefill_tokens_; }

  // The step ran Next(budget) (`fed` tokens of it). When that Feed chose, `logits` are the last
  // token's (vocab_size floats), or, where argmax_only(), `argmax` is the largest of them (a GPU
  // finds it without copying the logits back). Returns the token it generated, if any (none while
  // the prompt is not through, nor when an end token ended it). INTERNAL when the logits allow no
  // token: the model is broken.
  Result<std::optional<int32_t>> Advance(uint32_t fed, std::span<const float> logits,
                                         std::optional<int32_t> argmax = std::nullopt);

  // Greedy with no penalty and no log-probabilities: the argmax is all a choice needs.
  bool argmax_only() const { return argmax_only_; }
  bool ended() const { return ended_; }
  FinishReason finish() const { return finish_; }
  // Ends it as its caller says (a stop string found, the client gone).
  void End(FinishReason reason) {
    ended_ = true;
    finish_ = reason;
  }
  // The log-probabilities of the token Advance last returned, when the request asked for them.
  const std::optional<TokenLogprobs>& logprobs() const { return logprobs_; }
  const std::vector<int32_t>& generated() const { return generated_; }
  uint32_t prompt_tokens() const { return prompt_tokens_; }
  // Positions of the cache it has written.
  uint32_t position() const { return fed_; }
  // The most positions it can come to write, whatever it generates: its prompt and every token it
  // may generate but the last (which ends it unfed), up to the context.
  uint32_t most_positions() const {
    const uint64_t most = uint64_t{prompt_tokens_} + std::max(request_.max_tokens, 1u) - 1;
    return static_cast<uint32_t>(std::min<uint64_t>(most, context_));
  }

 private:
  TokenSequence(GenerationRequest request, uint32_t context);

  GenerationRequest request_;
  uint32_t context_;
  uint32_t prompt_tokens_;
  uint32_t prefill_tokens_;         // the prompt's and the resumed tokens
  std::vector<int32_t> seen_;       // prompt and generated tokens: the repetition penalty's
  std::vector<int32_t> generated_;  // end token excluded
  uint32_t fed_ = 0;                // tokens of seen_ in the cache
  uint32_t cached_ = 0;             // of the prompt's, found in the cache before the first step
  Sampler sampler_;
  bool argmax_only_;
  bool ended_ = false;
  FinishReason finish_ = FinishReason::kLength;
  std::optional<TokenLogprobs> logprobs_;
};

}  // namespace warmpool::transformer
