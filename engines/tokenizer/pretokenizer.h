// Splitting text into the pieces BPE encodes one at a time, with the Unicode regular expression a
// tokenizer.json names (GPT-2's, Llama 3's, Qwen's: classes like \p{L}, lookahead), run by PCRE2
// in UTF mode with Unicode properties. Behaviour "Isolated": every match is a piece, and so is any
// text between matches.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace warmpool::tokenizer {

// GPT-2's pattern: what a ByteLevel pre-tokenizer with use_regex splits by.
inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class RegexSplitter {
 public:
  static Result<RegexSplitter> Compile(std::string_view pattern, std::string_view source);
  RegexSplitter(RegexSplitter&&) noexcept;
  RegexSplitter& operator=(RegexSplitter&&) noexcept;
  ~RegexSplitter();

  // text must be valid UTF-8. The pieces cover it, in order.
  Status Split(std::string_view text, std::vector<std::string_view>* pieces) const;

 private:
  RegexSplitter() = default;
  struct Compiled;
  std::unique_ptr<Compiled> compiled_;
};

}  // namespace warmpool::tokenizer
