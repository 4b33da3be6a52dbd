#include "engines/transformer/text_sequence.h"

namespace warmpool::transformer {

Result<TextSequence> TextSequence::Start(const ServingFiles& files, const TextRequest& request, uint32_t context,
                                         uint32_t vocab_size) {
  GenerationRequest generation;
  if (!request.tokens.empty()) {
    generation.prompt = request.tokens;
  } else {
    Result<std::vector<int32_t>> encoded = files.tokenizer->Encode(request.prompt, request.add_special_tokens);
    if (!encoded.ok()) return encoded.status();
    generation.prompt = std::move(*encoded);
  }
  const uint64_t room = generation.prompt.size() < context ? context - generation.prompt.size() : 0;
  generation.max_tokens = request.max_tokens != 0 ? request.max_tokens : static_cast<uint32_t>(room);
  generation.sampling = request.sampling;
  generation.end_tokens = files.end_tokens;
  generation.logprobs = request.logprobs;
  generation.top_logprobs = request.top_logprobs;
  generation.resumed = request.resumed;
  Result<TokenSequence> tokens = TokenSequence::Start(std::move(generation), context, vocab_size);
  if (!tokens.ok()) return tokens.status();
  TextSequence text(files, std::move(*tokens), request.stop);
  // Resumed: the text of the tokens its client has, made again and not sent, so that what the
  // decoder and the stop strings held back (an incomplete character, a stop string's beginning)
  // is held again; a stop string those tokens completed ended it.
  for (int32_t token : request.resumed) {
    Result<std::string> piece = text.decoder_.Push(token);
    if (!piece.ok()) return piece.status();
    text.stops_.Push(*piece);
    if (text.stops_.stopped()) {
      text.tokens_.End(FinishReason::kStop);
      break;
    }
  }
  return text;
}

Result<TextSequence::Output> TextSequence::Advance(uint32_t fed, std::span<const float> logits,
                                                   std::optional<int32_t> argmax) {
  Output out;
  Result<std::optional<int32_t>> token = tokens_.Advance(fed, logits, argmax);
  if (!token.ok()) return token.status();
  if (token->has_value()) {
    Result<std::string> piece = decoder_.Push(**token);
    if (!piece.ok()) return piece.status();
    out.text = stops_.Push(*piece);
    out.token = **token;
    out.logprobs = tokens_.logprobs();
    // A stop string ends it here: nothing of it, nor after it, is sent.
    if (stops_.stopped()) tokens_.End(FinishReason::kStop);
  }
  if (tokens_.ended() && !stops_.stopped() && tokens_.finish() != FinishReason::kCancelled) {
    // The end: what the decoder and the stop strings held back, unless that completes a stop string.
    out.text += stops_.Push(decoder_.Finish());
    out.text += stops_.Finish();
    if (stops_.stopped()) tokens_.End(FinishReason::kStop);
  }
  return out;
}

TextResult TextSequence::result() const {
  TextResult result;
  result.prompt_tokens = tokens_.prompt_tokens();
  result.completion_tokens = static_cast<uint32_t>(tokens_.generated().size());
  result.finish = tokens_.finish();
  return result;
}

}  // namespace warmpool::transformer
