// SentencePiece-style BPE as tokenizer.json spells it (Llama 2, Mistral, TinyLlama): no
// pre-tokenizer splitting by pattern; spaces become '▁' (U+2581), and a '▁' is put before the text,
// either by the normalizer (Prepend then Replace, before every run of text between added tokens:
// the "legacy" behaviour) or by a Metaspace pre-tokenizer (prepend_scheme "first": only at the
// very start of the input; "always"; "never"). The decoder turns '▁' back into spaces and drops
// the one space the prefix put at the start.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/status.h"

namespace warmpool::tokenizer {

inline constexpr std::string_view kMetaspace = "\xE2\x96\x81";  // '▁'

struct Metaspace {
  // kNormalizer: before every run, always (the Prepend normalizer); kAlways, kFirst: a Metaspace
  // pre-tokenizer's, before every run or the first only, unless the run starts with '▁' already.
  enum class Prepend { kNormalizer, kAlways, kFirst, kNever } prepend = Prepend::kNormalizer;
  bool split = false;  // a piece per word, each starting at its '▁' (Metaspace split true)
  bool strip_leading_space = true;  // the decoder drops one leading space

  // text: one run between added tokens; at_start: it begins the input. Appends its pieces.
  void Pieces(std::string_view text, bool at_start, std::vector<std::string>* pieces) const;
};

// The style from the file's normalizer, pre_tokenizer and decoder; INVALID_ARGUMENT naming what
// differs from the forms above.
Result<Metaspace> ParseMetaspace(const nlohmann::json& file, std::string_view source);

}  // namespace warmpool::tokenizer
