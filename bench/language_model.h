// The language model the daemon benchmarks of --generate serve: a random Llama-shaped checkpoint
// of about the requested MiB of bf16 weights (1024 wide, 16 heads, 4 KV heads) with the shipped
// demo model's tokenizer, and a prompt of its vocabulary's own text of about the requested tokens.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "engines/transformer/random_checkpoint.h"

namespace warmpool::bench {

struct LanguageModel {
  uint32_t layers = 0;
  std::string prompt;
  uint32_t prompt_tokens = 0;
  std::string long_prompt;  // of about long_prompt_tokens, when asked for
  uint32_t long_prompt_tokens = 0;
};

// The shape of that checkpoint (1024 wide, MLP 2816, 16 heads and 4 KV heads of 64, bf16), as many
// layers as about model_mib MiB of such weights make (at least one): every bench of it shares it.
transformer::RandomCheckpoint LanguageModelShape(uint32_t model_mib);

// Writes the checkpoint into `directory` (created); tokenizer_dir holds tokenizer.json and
// tokenizer_config.json (the repository's demo/license-llama).
// context: the checkpoint's max_position_embeddings; long_prompt_tokens: 0 for no long prompt.
Result<LanguageModel> WriteLanguageModel(const std::string& directory, const std::string& tokenizer_dir,
                                         uint32_t model_mib, uint32_t prompt_tokens, uint32_t context = 2048,
                                         uint32_t long_prompt_tokens = 0);

}  // namespace warmpool::bench
