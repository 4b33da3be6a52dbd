#include "engines/transformer/token_sequence.h"

#include <algorithm>

namespace warmpool::transformer {

TokenSequence::TokenSequence(GenerationRequest request, uint32_t context)
    : request_(std::move(request)),
      context_(context),
      prompt_tokens_(static_cast<uint32_t>(request_.prompt.size())),
      seen_(request_.prompt),
      sampler_(request_.sampling),
      argmax_only_(ChoosesArgMax(request_.sampling) && !request_.logprobs) {}

Result<TokenSequence> TokenSequence::Start(GenerationRequest request, uint32_t context, uint32_t vocab_size) {
  if (request.prompt.empty()) return Error(Code::kInvalidArgument, "the prompt has no tokens");
  if (request.prompt.size() >= context) {
    return Error(Code::kInvalidArgument, "the prompt's {} tokens leave no room in a context of {}",
                 request.prompt.size(), context);
  }
  for (int32_t id : request.prompt) {
    if (id < 0 || static_cast<uint32_t>(id) >= vocab_size) {
      return Error(Code::kInvalidArgument, "token {} is outside the model's vocabulary of {}", id, vocab_size);
    }
  }
  if (Status s = CheckSamplingOptions(request.sampling); !s.ok()) return s;
  if (request.top_logprobs > kMaxTopLogprobs) {
    return Error(Code::kInvalidArgument, "top_logprobs {}: at most {}", request.top_logprobs, kMaxTopLogprobs);
  }
  return TokenSequence(std::move(request), context);
}

TokenSequence::Feed TokenSequence::Next(uint32_t budget) const {
  Feed feed;
  feed.start = fed_;
  if (fed_ < prompt_tokens_) {
    const uint32_t piece = std::min(std::max(budget, 1u), prompt_tokens_ - fed_);
    feed.tokens = std::span<const int32_t>(seen_).subspan(fed_, piece);
    // The prompt's last token's logits choose the first token (unless none is wanted).
    feed.chooses = fed_ + piece == prompt_tokens_ && request_.max_tokens > 0;
    return feed;
  }
  feed.tokens = std::span<const int32_t>(seen_).subspan(fed_, 1);  // the token chosen last
  feed.chooses = true;
  return feed;
}

void TokenSequence::Skip(uint32_t cached) {
  if (fed_ != 0 || cached >= prompt_tokens_) return;
  fed_ = cached_ = cached;
}

Result<std::optional<int32_t>> TokenSequence::Advance(uint32_t fed, std::span<const float> logits,
                                                      std::optional<int32_t> argmax) {
  const bool chose = Next(fed).chooses;
  fed_ += fed;
  logprobs_.reset();
  if (!chose) {
    if (fed_ == prompt_tokens_) End(FinishReason::kLength);  // a prompt run for nothing (max_tokens 0)
    return std::optional<int32_t>();
  }
  Result<int32_t> next = argmax_only_ && argmax ? Result<int32_t>(*argmax)
                         : argmax_only_         ? ArgMaxToken(logits)
                                                : sampler_.Next(logits, seen_);
  if (!next.ok()) return next.status();
  if (std::find(request_.end_tokens.begin(), request_.end_tokens.end(), *next) != request_.end_tokens.end()) {
    End(FinishReason::kStop);
    return std::optional<int32_t>();
  }
  if (request_.logprobs) logprobs_ = LogprobsOf(logits, *next, request_.top_logprobs);
  generated_.push_back(*next);
  seen_.push_back(*next);
  // The token just chosen goes into the cache at the next position: a full context ends here.
  if (generated_.size() == request_.max_tokens || seen_.size() - 1 >= context_) End(FinishReason::kLength);
  return std::optional<int32_t>(*next);
}

}  // namespace warmpool::transformer
