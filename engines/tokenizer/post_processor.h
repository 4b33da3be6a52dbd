// The tokens a tokenizer.json's post-processor puts around an encoded text when special tokens are
// asked for (Hugging Face's encode(text, add_special_tokens=True)): Llama's BOS before it, by a
// TemplateProcessing's "single" template, possibly inside a Sequence with a ByteLevel processor
// (which changes no ids). Other processors are refused by name.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/status.h"

namespace warmpool::tokenizer {

struct PostProcessor {
  std::vector<int32_t> before;  // ids put before the text
  std::vector<int32_t> after;   // and after it
};

// The file's "post_processor" (null: none).
Result<PostProcessor> ParsePostProcessor(const nlohmann::json& processor, std::string_view source);

}  // namespace warmpool::tokenizer
