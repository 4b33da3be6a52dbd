#include "engines/transformer/token_sequence.h"

#include <algorithm>

namespace warmpool::transformer {

TokenSequence::TokenSequence(GenerationRequest request, uint32_t context)
    : request_(std::move(request)),
      context_(context),
      prompt_tokens_(static_cast<uint32_t>(request_.prompt.size())),
      prefill_tokens_(static_cast<uint32_t>(request_.prompt.size() + request_.resumed.size())),
      seen_(request_.prompt),
      generated_(request_.resumed),
      sampler_(request_.sampling),
      argmax_only_(ChoosesArgMax(request_.sampling) && !request_.logprobs) {
  if (request_.resumed.empty()) return;
  // Resumed: everything the worker that died had generated goes in with the prompt, and the
  // sampler is where drawing it left it. Ended already if that was its last token.
  seen_.insert(seen_.end(), request_.resumed.begin(), request_.resumed.end());
  sampler_.Skip(request_.resumed.size());
  if (generated_.size() >= request_.max_tokens || seen_.size() - 1 >= context_) End(FinishReason::kLength);
}

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
  if (request.resumed.size() > request.max_tokens) {
    return Error(Code::kInvalidArgument, "{} tokens to resume: more than max_tokens {}", request.resumed.size(),
                 request.max_tokens);
  }
  if (request.prompt.size() + request.resumed.size() > uint64_t{context} + 1) {
    return Error(Code::kInvalidArgument, "{} tokens to resume after a prompt of {}: past the context of {}",
                 request.resumed.size(), request.prompt.size(), context);
  }
  for (int32_t id : request.resumed) {
    if (id < 0 || static_cast<uint32_t>(id) >= vocab_size ||
        std::find(request.end_tokens.begin(), request.end_tokens.end(), id) != request.end_tokens.end()) {
      return Error(Code::kInvalidArgument, "token {} to resume was never generated (outside the vocabulary, or an "
                   "end token)", id);
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
  if (fed_ < prefill_tokens_) {
    const uint32_t piece = std::min(std::max(budget, 1u), prefill_tokens_ - fed_);
    feed.tokens = std::span<const int32_t>(seen_).subspan(fed_, piece);
    // The prompt's last token's logits choose the first token (unless none is wanted); a resumed
    // generation's last token's, the next.
    feed.chooses = fed_ + piece == prefill_tokens_ && generated_.size() < request_.max_tokens;
    return feed;
  }
  feed.tokens = std::span<const int32_t>(seen_).subspan(fed_, 1);  // the token chosen last
  feed.chooses = true;
  return feed;
}

void TokenSequence::Skip(uint32_t cached) {
  if (fed_ != 0 || cached >= prefill_tokens_) return;
  fed_ = cached_ = cached;
}

Result<std::optional<int32_t>> TokenSequence::Advance(uint32_t fed, std::span<const float> logits,
                                                      std::optional<int32_t> argmax) {
  const bool chose = Next(fed).chooses;
  fed_ += fed;
  logprobs_.reset();
  if (!chose) {
    if (fed_ == prefill_tokens_) End(FinishReason::kLength);  // a prompt run for nothing (max_tokens 0)
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
