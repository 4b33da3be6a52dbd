#include "engines/transformer/text_generation.h"

#include <optional>

#include "engines/transformer/stop_strings.h"

namespace warmpool::transformer {

Result<TextResult> GenerateText(Sequence& model, const ServingFiles& files, const TextRequest& request,
                                const EmitFn& emit) {
  GenerationRequest generation;
  if (!request.tokens.empty()) {
    generation.prompt = request.tokens;
  } else {
    Result<std::vector<int32_t>> encoded = files.tokenizer->Encode(request.prompt, request.add_special_tokens);
    if (!encoded.ok()) return encoded.status();
    generation.prompt = std::move(*encoded);
  }
  for (int32_t id : generation.prompt) {
    if (id < 0 || static_cast<uint32_t>(id) >= model.config().vocab_size) {
      return Error(Code::kInvalidArgument, "token {} is outside the model's vocabulary of {}", id,
                   model.config().vocab_size);
    }
  }
  const uint64_t room = generation.prompt.size() < model.context() ? model.context() - generation.prompt.size() : 0;
  generation.max_tokens = request.max_tokens != 0 ? request.max_tokens : static_cast<uint32_t>(room);
  generation.sampling = request.sampling;
  generation.end_tokens = files.end_tokens;
  generation.logprobs = request.logprobs;
  generation.top_logprobs = request.top_logprobs;

  tokenizer::StreamingDecoder decoder(*files.tokenizer);
  StopStrings stops(request.stop);
  Status failed;
  bool client_stopped = false;
  std::optional<TokenLogprobs> logprobs;  // of the token on its way to on_token
  Result<Generation> done = Generate(model, generation, [&](int32_t token) {
    Result<std::string> piece = decoder.Push(token);
    if (!piece.ok()) {
      failed = piece.status();
      return false;
    }
    const std::string text = stops.Push(*piece);
    std::span<const TokenLogprobs> with;
    if (logprobs) with = {&*logprobs, 1};
    if (!emit(text, {&token, 1}, with)) {
      client_stopped = true;
      return false;
    }
    return !stops.stopped();
  }, [&] {
    if (emit("", {}, {})) return true;
    client_stopped = true;
    return false;
  }, [&](const TokenLogprobs& l) { logprobs = l; });
  if (!done.ok()) return done.status();
  if (!failed.ok()) return failed;
  TextResult result;
  result.prompt_tokens = done->prompt_tokens;
  result.completion_tokens = static_cast<uint32_t>(done->tokens.size());
  result.finish = done->finish;
  if (client_stopped) {
    result.finish = FinishReason::kCancelled;
    return result;
  }
  if (stops.stopped()) {
    result.finish = FinishReason::kStop;
    return result;
  }
  std::string tail = stops.Push(decoder.Finish());
  tail += stops.Finish();
  if (stops.stopped()) result.finish = FinishReason::kStop;  // the held-back bytes completed one
  if (!tail.empty() && !emit(tail, {}, {})) result.finish = FinishReason::kCancelled;
  return result;
}

}  // namespace warmpool::transformer
