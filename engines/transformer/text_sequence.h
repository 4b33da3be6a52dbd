// A generation in text (engines/transformer/text_generation.h) as a step drives it: a TokenSequence
// whose tokens become text that never splits a UTF-8 character, cut before the first stop string.
// The transformer engine's open sequences are these (engine ABI version 7), stepped together.
#pragma once

#include <optional>
#include <string>

#include "engines/tokenizer/tokenizer.h"
#include "engines/transformer/model_directory.h"
#include "engines/transformer/stop_strings.h"
#include "engines/transformer/text_generation.h"
#include "engines/transformer/token_sequence.h"

namespace warmpool::transformer {

class TextSequence {
 public:
  // The request tokenized (or its ids checked) and its options checked, as GenerateText does before
  // anything runs. files must outlive the sequence.
  static Result<TextSequence> Start(const ServingFiles& files, const TextRequest& request, uint32_t context,
                                    uint32_t vocab_size);

  TokenSequence& tokens() { return tokens_; }
  const TokenSequence& tokens() const { return tokens_; }
  bool ended() const { return tokens_.ended(); }

  // What one step made of it: text that may be sent (possibly empty), the token it came from, and
  // the token's log-probabilities when asked for. At the end (a stop string found, an end token, the
  // limit) `text` also holds what was held back.
  struct Output {
    std::string text;
    std::optional<int32_t> token;
    std::optional<TokenLogprobs> logprobs;
  };
  // TokenSequence::Advance, then the token's text. An error (the model's logits allow no token, a
  // token the tokenizer cannot decode) ends nothing by itself: the caller fails the sequence.
  Result<Output> Advance(uint32_t fed, std::span<const float> logits, std::optional<int32_t> argmax);
  // Its client left: ended, nothing more to send.
  void Cancel() { tokens_.End(FinishReason::kCancelled); }

  TextResult result() const;

 private:
  TextSequence(const ServingFiles& files, TokenSequence tokens, std::vector<std::string> stop)
      : tokens_(std::move(tokens)), decoder_(*files.tokenizer), stops_(std::move(stop)) {}

  TokenSequence tokens_;
  tokenizer::StreamingDecoder decoder_;
  StopStrings stops_;
};

}  // namespace warmpool::transformer
