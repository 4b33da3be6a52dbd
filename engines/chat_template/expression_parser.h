// The expressions of a chat template's tags (syntax.h), by recursive descent over a tag's tokens
// with Jinja's precedence (lowest first: conditional, or, and, not, comparisons, + -, ~, * / // %,
// **, unary minus, then postfix: attribute, subscript, call, filter, test). The statement parser
// (parser.cc) builds on it for the tags' keywords.
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "engines/chat_template/lexer.h"
#include "engines/chat_template/syntax.h"

namespace warmpool::chat {

// Deeper expressions or statements are refused: the parser and the renderer recurse once a level.
inline constexpr int kMaxDepth = 64;

class ExpressionParser {
 protected:
  const Token& Peek() const;
  const Token& Take();
  bool Accept(std::string_view op);
  bool AcceptName(std::string_view name);
  Status Expect(Token::Kind kind, std::string_view text);
  ExprPtr Make(Expr::Kind kind, std::string name = {}, ExprPtr a = nullptr, ExprPtr b = nullptr);
  Result<ExprPtr> Expression();
  template <typename Next>
  Result<ExprPtr> Binary(Next next, std::initializer_list<std::string_view> ops);
  Result<ExprPtr> Or();
  Result<ExprPtr> And();
  Result<ExprPtr> Not();
  Result<ExprPtr> Compare();
  Result<ExprPtr> Add();
  Result<ExprPtr> Concat();
  Result<ExprPtr> Multiply();
  Result<ExprPtr> Power();
  Result<ExprPtr> Unary();
  Status Arguments(Expr& call);
  Result<ExprPtr> Postfix(ExprPtr e);
  Result<ExprPtr> Primary();

  // The tag being read: its tokens (ending with kEnd), the next one, its line; and the nesting.
  const std::vector<Token>* tokens_ = nullptr;
  size_t next_ = 0;
  size_t line_ = 0;
  int depth_ = 0;
};

}  // namespace warmpool::chat
