#include "engines/tokenizer/added_tokens.h"

#include <utf8proc.h>

namespace warmpool::tokenizer {
namespace {

bool IsWhiteSpace(int32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
         c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

bool IsWordCharacter(int32_t c) {
  if (c < 0) return false;  // the start or the end of the text
  if (c == 0x200C || c == 0x200D) return true;  // the joiners
  switch (utf8proc_category(c)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT: case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

// The code point that starts at `at` (-1 past the end), and its length.
int32_t CodePointAt(std::string_view text, size_t at, size_t* length) {
  if (at >= text.size()) return -1;
  utf8proc_int32_t c = -1;
  const utf8proc_ssize_t n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(text.data() + at),
                                              static_cast<utf8proc_ssize_t>(text.size() - at), &c);
  *length = n > 0 ? static_cast<size_t>(n) : 1;
  return n > 0 ? c : -1;
}

// The code point that ends at `at` (-1 at the start), and its length.
int32_t CodePointBefore(std::string_view text, size_t at, size_t* length) {
  if (at == 0) return -1;
  size_t begin = at - 1;
  while (begin > 0 && (static_cast<uint8_t>(text[begin]) & 0xC0) == 0x80) --begin;
  size_t ignored = 0;
  *length = at - begin;
  return CodePointAt(text.substr(0, at), begin, &ignored);
}

}  // namespace

void AddedTokens::Add(AddedToken token) {
  by_first_byte_[static_cast<uint8_t>(token.content[0])].push_back(static_cast<uint32_t>(tokens_.size()));
  tokens_.push_back(std::move(token));
}

std::optional<AddedMatch> AddedTokens::Next(std::string_view text, size_t from, size_t floor) const {
  for (size_t i = from; i < text.size();) {
    const AddedToken* found = nullptr;
    for (uint32_t index : by_first_byte_[static_cast<uint8_t>(text[i])]) {
      const AddedToken& a = tokens_[index];
      if (text.substr(i).starts_with(a.content) && (found == nullptr || a.content.size() > found->content.size())) {
        found = &a;
      }
    }
    if (found == nullptr) {
      ++i;
      continue;
    }
    AddedMatch match{found, i, i + found->content.size()};
    size_t length = 0;
    if (found->single_word && (IsWordCharacter(CodePointBefore(text, match.start, &length)) ||
                               IsWordCharacter(CodePointAt(text, match.end, &length)))) {
      i = match.end;  // inside a word: no match, and the search goes on after it
      continue;
    }
    while (found->lstrip && match.start > floor && IsWhiteSpace(CodePointBefore(text, match.start, &length))) {
      match.start -= length;
    }
    while (found->rstrip && IsWhiteSpace(CodePointAt(text, match.end, &length))) match.end += length;
    return match;
  }
  return std::nullopt;
}

}  // namespace warmpool::tokenizer
