#include "engines/transformer/generation.h"

#include <algorithm>
#include <cmath>

namespace warmpool::transformer {

std::string_view FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kCancelled: return "cancelled";
  }
  return "?";
}

TokenLogprobs LogprobsOf(std::span<const float> logits, int32_t chosen, uint32_t top) {
  // log p_i = x_i - (max + log sum exp(x_j - max)), in double; NaN is -inf.
  double max = -INFINITY;
  for (float x : logits) {
    if (!std::isnan(x)) max = std::max(max, double{x});
  }
  double sum = 0;
  for (float x : logits) {
    if (!std::isnan(x) && max != -INFINITY) sum += std::exp(double{x} - max);
  }
  const double log_total = max + std::log(sum);
  auto logprob = [&](int32_t id) {
    const float x = logits[static_cast<size_t>(id)];
    return std::isnan(x) || max == -INFINITY ? -INFINITY : static_cast<float>(double{x} - log_total);
  };
  TokenLogprobs out;
  out.token = chosen;
  out.logprob = logprob(chosen);
  top = std::min<uint32_t>({top, kMaxTopLogprobs, static_cast<uint32_t>(logits.size())});
  std::vector<int32_t> ids(logits.size());
  for (size_t i = 0; i < ids.size(); i++) ids[i] = static_cast<int32_t>(i);
  auto more_likely = [&](int32_t a, int32_t b) {
    const float la = logprob(a), lb = logprob(b);
    return la > lb || (la == lb && a < b);
  };
  std::partial_sort(ids.begin(), ids.begin() + top, ids.end(), more_likely);
  for (uint32_t i = 0; i < top; i++) out.top.emplace_back(ids[i], logprob(ids[i]));
  return out;
}

Result<int32_t> Sequence::ForwardArgMax(std::span<const int32_t> tokens, uint32_t start) {
  std::vector<float> logits(config().vocab_size);
  if (Status s = Forward(tokens, start, logits); !s.ok()) return s;
  return ArgMaxToken(logits);
}

Result<Generation> Generate(Sequence& model, const GenerationRequest& request,
                            const std::function<bool(int32_t)>& on_token, const std::function<bool()>& on_progress,
                            const std::function<void(const TokenLogprobs&)>& on_logprobs) {
  if (request.prompt.empty()) return Error(Code::kInvalidArgument, "the prompt has no tokens");
  if (request.prompt.size() >= model.context()) {
    return Error(Code::kInvalidArgument, "the prompt's {} tokens leave no room in a context of {}",
                 request.prompt.size(), model.context());
  }
  if (Status s = CheckSamplingOptions(request.sampling); !s.ok()) return s;
  if (request.top_logprobs > kMaxTopLogprobs) {
    return Error(Code::kInvalidArgument, "top_logprobs {}: at most {}", request.top_logprobs, kMaxTopLogprobs);
  }

  Generation out;
  out.prompt_tokens = static_cast<uint32_t>(request.prompt.size());
  std::vector<int32_t> sequence = request.prompt;
  std::vector<float> logits(model.config().vocab_size);
  Sampler sampler(request.sampling);
  // Greedy with no penalty and no log-probabilities needs only the argmax, which the sequence finds
  // where its logits are (on a GPU: one id copied back instead of vocab_size floats); else the logits
  // come to the host and the sampler chooses. Either way the same token.
  const bool argmax_only = ChoosesArgMax(request.sampling) && !request.logprobs;
  auto step = [&](std::span<const int32_t> tokens, uint32_t start) -> Result<int32_t> {
    if (argmax_only) return model.ForwardArgMax(tokens, start);
    if (Status s = model.Forward(tokens, start, logits); !s.ok()) return s;
    return sampler.Next(logits, sequence);
  };
  const std::span<const int32_t> prompt(request.prompt);
  Result<int32_t> next = Error(Code::kInternal, "no token chosen");
  for (size_t done = 0; done < prompt.size(); done += kPrefillPiece) {
    if (done > 0 && on_progress && !on_progress()) {
      out.finish = FinishReason::kCancelled;
      return out;
    }
    const size_t piece = std::min<size_t>(kPrefillPiece, prompt.size() - done);
    const bool last = done + piece == prompt.size();
    if (last && request.max_tokens > 0) {
      next = step(prompt.subspan(done, piece), static_cast<uint32_t>(done));
      if (!next.ok()) return next.status();
    } else if (Status s = model.Forward(prompt.subspan(done, piece), static_cast<uint32_t>(done), logits); !s.ok()) {
      return s;
    }
  }
  while (out.tokens.size() < request.max_tokens) {
    if (!next.ok()) return next.status();
    const bool ends = std::find(request.end_tokens.begin(), request.end_tokens.end(), *next) != request.end_tokens.end();
    if (request.logprobs && on_logprobs && !ends) on_logprobs(LogprobsOf(logits, *next, request.top_logprobs));
    if (ends) {
      out.finish = FinishReason::kStop;
      return out;
    }
    out.tokens.push_back(*next);
    sequence.push_back(*next);
    if (on_token && !on_token(*next)) {
      out.finish = FinishReason::kCancelled;
      return out;
    }
    if (out.tokens.size() == request.max_tokens) break;
    // The token just chosen goes into the cache at the next position; a full context ends here.
    const auto position = static_cast<uint32_t>(sequence.size() - 1);
    if (position >= model.context()) break;
    next = step({&sequence.back(), 1}, position);
  }
  out.finish = FinishReason::kLength;
  return out;
}

}  // namespace warmpool::transformer
