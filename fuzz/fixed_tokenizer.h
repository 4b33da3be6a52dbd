// A small byte-level BPE tokenizer.json for fuzz targets that need a valid one: every byte a token
// (ids 0 to 255), three merges (ids 256 to 258), Llama 3's pre-tokenizer pattern, and two special
// added tokens, "<|end|>" (259) and "<|end|>>" (260), the second a prefix trap for the first.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "engines/tokenizer/byte_level.h"

namespace warmpool::fuzz {

inline std::string ByteLevelTokenizerJson() {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[tokenizer::ByteSymbol(static_cast<uint8_t>(b))] = b;
  vocab["th"] = 256;
  vocab["Ġth"] = 257;
  vocab["Ġthe"] = 258;
  const nlohmann::json json = {
      {"added_tokens",
       {{{"id", 259}, {"content", "<|end|>"}, {"special", true}},
        {{"id", 260}, {"content", "<|end|>>"}, {"special", true}}}},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern",
            {{"Regex", R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}}},
           {"behavior", "Isolated"}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"t h", "Ġ th", "Ġth e"}}}}};
  return json.dump();
}

}  // namespace warmpool::fuzz
