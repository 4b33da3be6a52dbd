// The added tokens of a tokenizer.json ("added_tokens"): texts matched in the input before anything
// else, as Hugging Face's tokenizers match them — the leftmost occurrence, the longest of those that
// start there, occurrences never overlapping — with each token's options:
//   single_word: an occurrence inside a word (a word character just before or after it) is no
//                match, and the search goes on after it;
//   lstrip, rstrip: the whitespace just before (not reaching back into an earlier match) or after
//                it belongs to the token, and so is not encoded.
// Word characters are those of a Unicode regex's \w (letters, marks, decimal and letter numbers,
// connector punctuation, the two joiners); whitespace is Unicode's White_Space property.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace warmpool::tokenizer {

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
};

// An added token found in a text: it takes [start, end), its stripped whitespace included.
struct AddedMatch {
  const AddedToken* token = nullptr;
  size_t start = 0;
  size_t end = 0;
};

class AddedTokens {
 public:
  void Add(AddedToken token);  // content not empty
  const std::vector<AddedToken>& all() const { return tokens_; }
  bool empty() const { return tokens_.empty(); }

  // The next match in text (valid UTF-8) at or after `from`; `floor` is where the text not yet
  // encoded starts (an lstrip never reaches before it).
  std::optional<AddedMatch> Next(std::string_view text, size_t from, size_t floor) const;

 private:
  std::vector<AddedToken> tokens_;
  std::array<std::vector<uint32_t>, 256> by_first_byte_;  // indices into tokens_
};

}  // namespace warmpool::tokenizer
