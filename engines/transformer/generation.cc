#include "engines/transformer/generation.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "engines/transformer/sequence_slots.h"
#include "engines/transformer/token_sequence.h"

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
  Result<TokenSequence> started = TokenSequence::Start(request, model.context(), model.config().vocab_size);
  if (!started.ok()) return started.status();
  TokenSequence& sequence = *started;
  Generation out;
  out.prompt_tokens = sequence.prompt_tokens();
  OneSlot slot(model);
  const StepMember member{&sequence, 0};
  while (!sequence.ended()) {
    // Between a prompt's pieces: progress, and a point where it can be stopped.
    if (sequence.position() > 0 && sequence.position() < sequence.prefill_tokens() && on_progress && !on_progress()) {
      sequence.End(FinishReason::kCancelled);
      break;
    }
    Result<std::optional<int32_t>> token = std::optional<int32_t>();
    Status ran = RunStep(slot, {&member, 1}, [&](size_t, uint32_t fed, std::span<const float> logits,
                                                 std::optional<int32_t> argmax) {
      token = sequence.Advance(fed, logits, argmax);
    });
    if (!ran.ok()) return ran;
    if (!token.ok()) return token.status();
    if (!token->has_value()) continue;
    if (sequence.logprobs() && on_logprobs) on_logprobs(*sequence.logprobs());
    if (on_token && !on_token(**token)) sequence.End(FinishReason::kCancelled);
  }
  out.tokens = sequence.generated();
  out.finish = sequence.finish();
  return out;
}

}  // namespace warmpool::transformer
