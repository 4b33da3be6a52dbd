// A chat template's source cut into pieces: text (with Jinja's whitespace control applied, and
// Hugging Face's trim_blocks and lstrip_blocks), {{ output }} and {% statement %} tags as tokens.
// Comments are dropped.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace warmpool::chat {

struct Token {
  enum class Kind { kName, kInt, kFloat, kString, kOperator, kEnd };
  Kind kind = Kind::kEnd;
  std::string text;  // a name, an operator, a string's value, a number's digits
  size_t line = 0;
};

struct Piece {
  enum class Kind { kText, kOutput, kStatement };
  Kind kind = Kind::kText;
  std::string text;
  std::vector<Token> tokens;  // ends with a kEnd token
  size_t line = 0;
};

Result<std::vector<Piece>> Lex(const std::string& source);

}  // namespace warmpool::chat
