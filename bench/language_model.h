// The language model the daemon benchmarks of --generate serve: a random Llama-shaped checkpoint
// of about the requested MiB of bf16 weights (1024 wide, 16 heads, 4 KV heads) with the shipped
// demo model's tokenizer, and a prompt of its vocabulary's own text of about the requested tokens.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace warmpool::bench {

struct LanguageModel {
  uint32_t layers = 0;
  std::string prompt;
  uint32_t prompt_tokens = 0;
};

// Writes the checkpoint into `directory` (created); tokenizer_dir holds tokenizer.json and
// tokenizer_config.json (the repository's demo/license-llama).
Result<LanguageModel> WriteLanguageModel(const std::string& directory, const std::string& tokenizer_dir,
                                         uint32_t model_mib, uint32_t prompt_tokens);

}  // namespace warmpool::bench
