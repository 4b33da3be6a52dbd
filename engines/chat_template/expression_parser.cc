#include "engines/chat_template/expression_parser.h"

#include <charconv>
#include <cstdlib>

namespace warmpool::chat {

const Token& ExpressionParser::Peek() const { return (*tokens_)[next_]; }
const Token& ExpressionParser::Take() { return (*tokens_)[next_ < tokens_->size() - 1 ? next_++ : next_]; }
bool ExpressionParser::Accept(std::string_view op) {
  if (Peek().kind == Token::Kind::kOperator && Peek().text == op) return next_++, true;
  return false;
}

bool ExpressionParser::AcceptName(std::string_view name) {
  if (Peek().kind == Token::Kind::kName && Peek().text == name) return next_++, true;
  return false;
}

Status ExpressionParser::Expect(Token::Kind kind, std::string_view text) {
  const Token& t = Peek();
  if (t.kind == kind && (text.empty() || t.text == text)) return Take(), OkStatus();
  return Error(Code::kInvalidArgument, "line {}: expected {} but found {}", t.line,
               kind == Token::Kind::kEnd ? "the end of the tag" : "'" + std::string(text) + "'",
               t.kind == Token::Kind::kEnd ? "the end of the tag" : "'" + t.text + "'");
}

ExprPtr ExpressionParser::Make(Expr::Kind kind, std::string name, ExprPtr a, ExprPtr b) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->name = std::move(name);
  e->a = std::move(a);
  e->b = std::move(b);
  e->line = line_;
  return e;
}

Result<ExprPtr> ExpressionParser::Expression() {
  if (++depth_ > kMaxDepth) return Error(Code::kInvalidArgument, "line {}: an expression nested deeper than {}", line_, kMaxDepth);
  Result<ExprPtr> value = Or();
  if (value.ok() && AcceptName("if")) {
    Result<ExprPtr> condition = Or();
    if (!condition.ok()) return condition.status();
    ExprPtr otherwise;
    if (AcceptName("else")) {
      Result<ExprPtr> e = Expression();
      if (!e.ok()) return e.status();
      otherwise = std::move(*e);
    }
    ExprPtr c = Make(Expr::Kind::kConditional, "", std::move(*value), std::move(otherwise));
    c->c = std::move(*condition);
    value = std::move(c);
  }
  depth_--;
  return value;
}

template <typename Next>
Result<ExprPtr> ExpressionParser::Binary(Next next, std::initializer_list<std::string_view> ops) {
  Result<ExprPtr> left = (this->*next)();
  while (left.ok()) {
    std::string op;
    for (std::string_view o : ops) {
      if (Accept(o)) op = o;
    }
    if (op.empty()) break;
    Result<ExprPtr> right = (this->*next)();
    if (!right.ok()) return right;
    left = Make(Expr::Kind::kBinary, op, std::move(*left), std::move(*right));
  }
  return left;
}

Result<ExprPtr> ExpressionParser::Or() {
  Result<ExprPtr> left = And();
  while (left.ok() && AcceptName("or")) {
    Result<ExprPtr> right = And();
    if (!right.ok()) return right;
    left = Make(Expr::Kind::kOr, "", std::move(*left), std::move(*right));
  }
  return left;
}

Result<ExprPtr> ExpressionParser::And() {
  Result<ExprPtr> left = Not();
  while (left.ok() && AcceptName("and")) {
    Result<ExprPtr> right = Not();
    if (!right.ok()) return right;
    left = Make(Expr::Kind::kAnd, "", std::move(*left), std::move(*right));
  }
  return left;
}

Result<ExprPtr> ExpressionParser::Not() {
  if (AcceptName("not")) {
    if (++depth_ > kMaxDepth) return Error(Code::kInvalidArgument, "line {}: too many nots", line_);
    Result<ExprPtr> operand = Not();
    depth_--;
    if (!operand.ok()) return operand;
    return Make(Expr::Kind::kNot, "", std::move(*operand));
  }
  return Compare();
}

Result<ExprPtr> ExpressionParser::Compare() {
  Result<ExprPtr> left = Add();
  while (left.ok()) {
    std::string op;
    bool negated = false;
    for (std::string_view o : {"==", "!=", "<=", ">=", "<", ">"}) {
      if (op.empty() && Accept(o)) op = o;
    }
    if (op.empty() && AcceptName("in")) op = "in";
    if (op.empty() && Peek().kind == Token::Kind::kName && Peek().text == "not" && next_ + 1 < tokens_->size() &&
        (*tokens_)[next_ + 1].text == "in") {
      next_ += 2;
      op = "in";
      negated = true;
    }
    if (op.empty()) break;
    Result<ExprPtr> right = Add();
    if (!right.ok()) return right;
    left = Make(Expr::Kind::kBinary, op, std::move(*left), std::move(*right));
    (*left)->negated = negated;
  }
  return left;
}

Result<ExprPtr> ExpressionParser::Add() { return Binary(&ExpressionParser::Concat, {"+", "-"}); }
Result<ExprPtr> ExpressionParser::Concat() { return Binary(&ExpressionParser::Multiply, {"~"}); }
Result<ExprPtr> ExpressionParser::Multiply() { return Binary(&ExpressionParser::Power, {"*", "/", "//", "%"}); }
Result<ExprPtr> ExpressionParser::Power() { return Binary(&ExpressionParser::Unary, {"**"}); }
Result<ExprPtr> ExpressionParser::Unary() {
  if (Accept("-")) {
    if (++depth_ > kMaxDepth) return Error(Code::kInvalidArgument, "line {}: too many minus signs", line_);
    Result<ExprPtr> operand = Unary();
    depth_--;
    if (!operand.ok()) return operand;
    return Make(Expr::Kind::kNegate, "", std::move(*operand));
  }
  if (Accept("+")) return Unary();
  Result<ExprPtr> e = Primary();
  if (!e.ok()) return e;
  return Postfix(std::move(*e));
}

Status ExpressionParser::Arguments(Expr& call) {  // after "(": positional, then keyword arguments, up to ")"
  while (!Accept(")")) {
    if (Peek().kind == Token::Kind::kName && next_ + 1 < tokens_->size() && (*tokens_)[next_ + 1].text == "=" &&
        (*tokens_)[next_ + 1].kind == Token::Kind::kOperator) {
      call.keywords.push_back(Take().text);
      Take();
    } else if (!call.keywords.empty()) {
      return Error(Code::kInvalidArgument, "line {}: a positional argument after a keyword one", line_);
    }
    Result<ExprPtr> arg = Expression();
    if (!arg.ok()) return arg.status();
    call.items.push_back(std::move(*arg));
    if (!Accept(",") && !(Peek().kind == Token::Kind::kOperator && Peek().text == ")")) {
      return Error(Code::kInvalidArgument, "line {}: , or ) in a call", line_);
    }
  }
  return OkStatus();
}

Result<ExprPtr> ExpressionParser::Postfix(ExprPtr e) {
  for (;;) {
    if (Accept(".")) {
      if (Peek().kind != Token::Kind::kName && Peek().kind != Token::Kind::kInt) {
        return Error(Code::kInvalidArgument, "line {}: a name after '.'", line_);
      }
      e = Make(Expr::Kind::kAttribute, Take().text, std::move(e));
    } else if (Accept("[")) {
      ExprPtr index = Make(Expr::Kind::kIndex, "", std::move(e));
      ExprPtr bounds[3];
      int part = 0;
      bool slice = false;
      while (!Accept("]")) {
        if (Accept(":")) {
          slice = true;
          if (++part > 2) return Error(Code::kInvalidArgument, "line {}: a slice has at most 3 parts", line_);
          continue;
        }
        Result<ExprPtr> bound = Expression();
        if (!bound.ok()) return bound;
        bounds[part] = std::move(*bound);
        if (Peek().kind == Token::Kind::kEnd) return Error(Code::kInvalidArgument, "line {}: ] missing", line_);
      }
      if (slice) {
        index->kind = Expr::Kind::kSlice;
        index->b = std::move(bounds[0]);
        index->c = std::move(bounds[1]);
        if (bounds[2]) index->items.push_back(std::move(bounds[2]));
      } else {
        if (!bounds[0]) return Error(Code::kInvalidArgument, "line {}: an empty subscript", line_);
        index->b = std::move(bounds[0]);
      }
      e = std::move(index);
    } else if (Accept("(")) {
      ExprPtr call = Make(Expr::Kind::kCall, "", std::move(e));
      if (Status s = Arguments(*call); !s.ok()) return s;
      e = std::move(call);
    } else if (Accept("|")) {
      if (Peek().kind != Token::Kind::kName) return Error(Code::kInvalidArgument, "line {}: a filter name after |", line_);
      ExprPtr filter = Make(Expr::Kind::kFilter, Take().text, std::move(e));
      if (Accept("(")) {
        if (Status s = Arguments(*filter); !s.ok()) return s;
      }
      e = std::move(filter);
    } else if (AcceptName("is")) {
      const bool negated = AcceptName("not");
      if (Peek().kind != Token::Kind::kName) return Error(Code::kInvalidArgument, "line {}: a test name after is", line_);
      ExprPtr test = Make(Expr::Kind::kTest, Take().text, std::move(e));
      test->negated = negated;
      if (Accept("(")) {
        if (Status s = Arguments(*test); !s.ok()) return s;
      } else if (Peek().kind == Token::Kind::kString || Peek().kind == Token::Kind::kInt ||
                 Peek().kind == Token::Kind::kFloat) {  // `is equalto 3`, `is sameas none`
        Result<ExprPtr> arg = Primary();
        if (!arg.ok()) return arg;
        test->items.push_back(std::move(*arg));
      }
      e = std::move(test);
    } else {
      return e;
    }
  }
}

Result<ExprPtr> ExpressionParser::Primary() {
  const Token t = Take();
  switch (t.kind) {
    case Token::Kind::kString: {
      std::string text = t.text;
      while (Peek().kind == Token::Kind::kString) text += Take().text;  // adjacent literals join
      ExprPtr e = Make(Expr::Kind::kLiteral);
      e->literal = Value::String(std::move(text));
      return e;
    }
    case Token::Kind::kInt:
    case Token::Kind::kFloat: {
      ExprPtr e = Make(Expr::Kind::kLiteral);
      if (t.kind == Token::Kind::kInt) {
        int64_t i = 0;
        auto [p, ec] = std::from_chars(t.text.data(), t.text.data() + t.text.size(), i);
        if (ec != std::errc()) return Error(Code::kInvalidArgument, "line {}: {} is too large", line_, t.text);
        e->literal = Value::Int(i);
      } else {
        e->literal = Value::Float(std::strtod(t.text.c_str(), nullptr));
      }
      return e;
    }
    case Token::Kind::kName: {
      ExprPtr e = Make(Expr::Kind::kLiteral);
      if (t.text == "true" || t.text == "True") e->literal = Value::Bool(true);
      else if (t.text == "false" || t.text == "False") e->literal = Value::Bool(false);
      else if (t.text == "none" || t.text == "None") e->literal = Value::None();
      else e = Make(Expr::Kind::kName, t.text);
      return e;
    }
    case Token::Kind::kOperator:
      if (t.text == "(") {
        Result<ExprPtr> inner = Expression();
        if (!inner.ok()) return inner;
        if (Accept(",")) {  // a tuple: a list to the renderer
          ExprPtr list = Make(Expr::Kind::kList);
          list->items.push_back(std::move(*inner));
          while (!Accept(")")) {
            Result<ExprPtr> item = Expression();
            if (!item.ok()) return item;
            list->items.push_back(std::move(*item));
            if (!Accept(",") && !(Peek().kind == Token::Kind::kOperator && Peek().text == ")")) {
              return Error(Code::kInvalidArgument, "line {}: , or ) in a tuple", line_);
            }
          }
          return list;
        }
        if (Status s = Expect(Token::Kind::kOperator, ")"); !s.ok()) return s;
        return inner;
      }
      if (t.text == "[" || t.text == "{") {
        const bool dict = t.text == "{";
        ExprPtr e = Make(dict ? Expr::Kind::kDict : Expr::Kind::kList);
        while (!Accept(dict ? "}" : "]")) {
          Result<ExprPtr> item = Expression();
          if (!item.ok()) return item;
          e->items.push_back(std::move(*item));
          if (dict) {
            if (Status s = Expect(Token::Kind::kOperator, ":"); !s.ok()) return s;
            Result<ExprPtr> value = Expression();
            if (!value.ok()) return value;
            e->items.push_back(std::move(*value));
          }
          if (!Accept(",") && !(Peek().kind == Token::Kind::kOperator && Peek().text == (dict ? "}" : "]"))) {
            return Error(Code::kInvalidArgument, "line {}: , or {} in a {}", line_, dict ? "}" : "]", dict ? "dict" : "list");
          }
        }
        return e;
      }
      break;
    case Token::Kind::kEnd: return Error(Code::kInvalidArgument, "line {}: an expression is missing", line_);
  }
  return Error(Code::kInvalidArgument, "line {}: unexpected '{}'", line_, t.text);
}

}  // namespace warmpool::chat
