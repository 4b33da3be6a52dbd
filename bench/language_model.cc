#include "bench/language_model.h"

#include <algorithm>
#include <filesystem>

#include "engines/tokenizer/tokenizer.h"
#include "engines/transformer/random_checkpoint.h"

namespace warmpool::bench {

namespace fs = std::filesystem;

transformer::RandomCheckpoint LanguageModelShape(uint32_t model_mib) {
  transformer::RandomCheckpoint spec;
  spec.hidden_size = 1024;
  spec.intermediate_size = 2816;
  spec.num_attention_heads = 16;
  spec.num_key_value_heads = 4;
  spec.dtype = safetensors::DType::BF16;
  const uint64_t per_layer = (2ull * 1024 * 1024 + 2ull * 1024 * 256 + 3ull * 1024 * 2816) * 2;
  spec.num_hidden_layers = static_cast<uint32_t>(std::max<uint64_t>(1, (uint64_t{model_mib} << 20) / per_layer));
  return spec;
}

Result<LanguageModel> WriteLanguageModel(const std::string& directory, const std::string& tokenizer_dir,
                                         uint32_t model_mib, uint32_t prompt_tokens, uint32_t context,
                                         uint32_t long_prompt_tokens) {
  fs::create_directories(directory);
  std::error_code ec;
  for (const char* name : {"tokenizer.json", "tokenizer_config.json"}) {
    fs::copy_file(fs::path(tokenizer_dir) / name, fs::path(directory) / name, ec);
    if (ec) {
      return Error(Code::kNotFound, "{}/{}: {} (run from the repository root, or give --tokenizer-dir)", tokenizer_dir,
                   name, ec.message());
    }
  }
  Result<std::unique_ptr<tokenizer::Tokenizer>> t = tokenizer::Tokenizer::Load(directory + "/tokenizer.json");
  if (!t.ok()) return t.status();
  transformer::RandomCheckpoint spec = LanguageModelShape(model_mib);
  spec.vocab_size = (*t)->vocab_size();
  spec.max_position_embeddings = context;
  if (Status s = transformer::WriteRandomCheckpoint(directory, spec); !s.ok()) return s;
  LanguageModel model;
  model.layers = spec.num_hidden_layers;
  auto grow = [&](std::string& text, uint32_t& tokens, uint32_t wanted) -> Status {
    while (tokens < wanted) {
      text += "the terms of this License ";
      Result<std::vector<int32_t>> ids = (*t)->Encode(text);
      if (!ids.ok()) return ids.status();
      tokens = static_cast<uint32_t>(ids->size());
    }
    return OkStatus();
  };
  if (Status s = grow(model.prompt, model.prompt_tokens, prompt_tokens); !s.ok()) return s;
  if (Status s = grow(model.long_prompt, model.long_prompt_tokens, long_prompt_tokens); !s.ok()) return s;
  return model;
}

}  // namespace warmpool::bench
