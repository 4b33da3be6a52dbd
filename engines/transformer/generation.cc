#include "engines/transformer/generation.h"

#include <algorithm>

namespace warmpool::transformer {

std::string_view FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kCancelled: return "cancelled";
  }
  return "?";
}

Result<Generation> Generate(Sequence& model, const GenerationRequest& request,
                            const std::function<bool(int32_t)>& on_token, const std::function<bool()>& on_progress) {
  if (request.prompt.empty()) return Error(Code::kInvalidArgument, "the prompt has no tokens");
  if (request.prompt.size() >= model.context()) {
    return Error(Code::kInvalidArgument, "the prompt's {} tokens leave no room in a context of {}",
                 request.prompt.size(), model.context());
  }
  if (Status s = CheckSamplingOptions(request.sampling); !s.ok()) return s;

  Generation out;
  out.prompt_tokens = static_cast<uint32_t>(request.prompt.size());
  std::vector<int32_t> sequence = request.prompt;
  std::vector<float> logits(model.config().vocab_size);
  const std::span<const int32_t> prompt(request.prompt);
  for (size_t done = 0; done < prompt.size(); done += kPrefillPiece) {
    if (done > 0 && on_progress && !on_progress()) {
      out.finish = FinishReason::kCancelled;
      return out;
    }
    const size_t piece = std::min<size_t>(kPrefillPiece, prompt.size() - done);
    if (Status s = model.Forward(prompt.subspan(done, piece), static_cast<uint32_t>(done), logits); !s.ok()) return s;
  }
  Sampler sampler(request.sampling);
  while (out.tokens.size() < request.max_tokens) {
    Result<int32_t> next = sampler.Next(logits, sequence);
    if (!next.ok()) return next.status();
    if (std::find(request.end_tokens.begin(), request.end_tokens.end(), *next) != request.end_tokens.end()) {
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
    if (Status s = model.Forward({&sequence.back(), 1}, position, logits); !s.ok()) return s;
  }
  out.finish = FinishReason::kLength;
  return out;
}

}  // namespace warmpool::transformer
