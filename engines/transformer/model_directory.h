// Everything a Hugging Face model directory says about serving it, read and checked together: the
// checkpoint (config.json and the weights), the tokenizer (tokenizer.json), the chat template and
// special tokens (tokenizer_config.json), and the generation defaults (generation_config.json,
// optional). Each file is checked against the others: the tokenizer's ids must fit the model's
// vocabulary, the end tokens must be tokens.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "engines/tokenizer/tokenizer.h"
#include "engines/transformer/checkpoint.h"
#include "engines/transformer/sampler.h"

namespace warmpool::transformer {

struct ModelDirectory {
  std::unique_ptr<Checkpoint> checkpoint;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;
  std::string chat_template;        // tokenizer_config.json's ("default" of several); "" when none
  std::optional<int32_t> bos;       // the beginning-of-sequence token, where the model has one
  std::vector<int32_t> end_tokens;  // generation stops at any of these
  SamplingOptions sampling;         // the model's defaults: greedy unless generation_config samples

  // Errors name the file and what is wrong with it.
  static Result<ModelDirectory> Open(const std::string& directory);
};

}  // namespace warmpool::transformer
