// The template's pieces (lexer.h) as a tree (syntax.h): statements by their tags' keywords, the
// expressions in them by ExpressionParser (expression_parser.h).
#include "engines/chat_template/expression_parser.h"

namespace warmpool::chat {
namespace {

class Parser : public ExpressionParser {
 public:
  explicit Parser(std::vector<Piece> pieces) : pieces_(std::move(pieces)) {}

  Result<Body> Parse() {
    Result<Body> body = ParseBody({});
    if (!body.ok()) return body.status();
    if (at_ < pieces_.size()) return Error(Code::kInvalidArgument, "line {}: unexpected {{% {} %}}", pieces_[at_].line, Keyword());
    return body;
  }

 private:
  // ---- statements ----

  std::string Keyword() const {
    const Piece& p = pieces_[at_];
    return p.tokens.empty() ? "" : p.tokens[0].text;
  }

  // Until a statement whose keyword is one of `ends` (left unconsumed) or the end.
  Result<Body> ParseBody(std::initializer_list<std::string_view> ends) {
    if (++depth_ > kMaxDepth) return Error(Code::kInvalidArgument, "statements nested deeper than {}", kMaxDepth);
    Body body;
    while (at_ < pieces_.size()) {
      Piece& p = pieces_[at_];
      if (p.kind == Piece::Kind::kText) {
        Node text;
        text.text = p.text;
        body.push_back(std::move(text));
        at_++;
        continue;
      }
      tokens_ = &p.tokens;
      next_ = 0;
      line_ = p.line;
      if (p.kind == Piece::Kind::kOutput) {
        at_++;
        Result<ExprPtr> e = Expression();
        if (!e.ok()) return e.status();
        if (Status s = Expect(Token::Kind::kEnd, ""); !s.ok()) return s;
        Node n;
        n.kind = Node::Kind::kOutput;
        n.expr = std::move(*e);
        n.line = p.line;
        body.push_back(std::move(n));
        continue;
      }
      const std::string keyword = Keyword();
      for (std::string_view end : ends) {
        if (keyword == end) {
          depth_--;
          return body;
        }
      }
      at_++;
      next_ = 1;
      Result<Node> n = Statement(keyword);
      if (!n.ok()) return n.status();
      if (n->kind != Node::Kind::kText || !n->text.empty()) body.push_back(std::move(*n));
    }
    if (ends.size() > 0) return Error(Code::kInvalidArgument, "the template ends inside a block: {{% {} %}} missing", *ends.begin());
    depth_--;
    return body;
  }

  // Consumes the statement tag `keyword` that ParseBody stopped at, checking nothing follows it.
  Status Closing(const char* keyword) {
    if (at_ >= pieces_.size() || Keyword() != keyword) return Error(Code::kInvalidArgument, "{{% {} %}} missing", keyword);
    tokens_ = &pieces_[at_].tokens;
    next_ = 1;
    at_++;
    return Expect(Token::Kind::kEnd, "");
  }

  Result<Node> Statement(const std::string& keyword) {
    Node n;
    n.line = line_;
    if (keyword == "if") {
      n.kind = Node::Kind::kIf;
      for (;;) {
        Result<ExprPtr> condition = Expression();
        if (!condition.ok()) return condition.status();
        if (Status s = Expect(Token::Kind::kEnd, ""); !s.ok()) return s;
        Result<Body> body = ParseBody({"elif", "else", "endif"});
        if (!body.ok()) return body.status();
        n.branches.emplace_back(std::move(*condition), std::move(*body));
        if (at_ >= pieces_.size()) return Error(Code::kInvalidArgument, "{{% endif %}} missing");
        const std::string next = Keyword();
        tokens_ = &pieces_[at_].tokens;
        next_ = 1;
        line_ = pieces_[at_].line;
        at_++;
        if (next == "elif") continue;
        if (next == "else") {
          if (Status s = Expect(Token::Kind::kEnd, ""); !s.ok()) return s;
          Result<Body> otherwise = ParseBody({"endif"});
          if (!otherwise.ok()) return otherwise.status();
          n.branches.emplace_back(nullptr, std::move(*otherwise));
          if (Status s = Closing("endif"); !s.ok()) return s;
        } else if (Status s = Expect(Token::Kind::kEnd, ""); !s.ok()) {
          return s;
        }
        return n;
      }
    }
    if (keyword == "for") {
      n.kind = Node::Kind::kFor;
      do {
        if (Peek().kind != Token::Kind::kName) return Error(Code::kInvalidArgument, "line {}: for needs a name", line_);
        n.targets.push_back(Take().text);
      } while (Accept(","));
      if (!AcceptName("in")) return Error(Code::kInvalidArgument, "line {}: for ... in, without in", line_);
      Result<ExprPtr> iterable = Or();  // not a conditional: `if` here filters the loop
      if (!iterable.ok()) return iterable.status();
      n.expr = std::move(*iterable);
      if (AcceptName("if")) {
        Result<ExprPtr> filter = Or();
        if (!filter.ok()) return filter.status();
        n.filter = std::move(*filter);
      }
      if (Status s = Expect(Token::Kind::kEnd, ""); !s.ok()) return s;
      Result<Body> body = ParseBody({"else", "endfor"});
      if (!body.ok()) return body.status();
      n.body = std::move(*body);
      if (at_ < pieces_.size() && Keyword() == "else") {
        if (Status s = Closing("else"); !s.ok()) return s;
        Result<Body> otherwise = ParseBody({"endfor"});
        if (!otherwise.ok()) return otherwise.status();
        n.otherwise = std::move(*otherwise);
      }
      if (Status s = Closing("endfor"); !s.ok()) return s;
      return n;
    }
    if (keyword == "set") {
      n.kind = Node::Kind::kSet;
      if (Peek().kind != Token::Kind::kName) return Error(Code::kInvalidArgument, "line {}: set needs a name", line_);
      n.text = Take().text;
      if (Accept(".")) {
        if (Peek().kind != Token::Kind::kName) return Error(Code::kInvalidArgument, "line {}: set x.<name>", line_);
        n.attribute = Take().text;
      }
      if (!Accept("=")) return Error(Code::kInvalidArgument, "line {}: set without = (block sets are not supported)", line_);
      Result<ExprPtr> value = Expression();
      if (!value.ok()) return value.status();
      n.expr = std::move(*value);
      if (Status s = Expect(Token::Kind::kEnd, ""); !s.ok()) return s;
      return n;
    }
    if (keyword == "macro") {
      n.kind = Node::Kind::kMacro;
      if (Peek().kind != Token::Kind::kName) return Error(Code::kInvalidArgument, "line {}: macro needs a name", line_);
      n.text = Take().text;
      if (!Accept("(")) return Error(Code::kInvalidArgument, "line {}: macro {}(...) needs its parameters", line_, n.text);
      while (!Accept(")")) {
        if (Peek().kind != Token::Kind::kName) return Error(Code::kInvalidArgument, "line {}: a parameter name", line_);
        n.targets.push_back(Take().text);
        ExprPtr fallback;
        if (Accept("=")) {
          Result<ExprPtr> d = Expression();
          if (!d.ok()) return d.status();
          fallback = std::move(*d);
        }
        n.defaults.push_back(std::move(fallback));
        if (!Accept(",") && !(Peek().text == ")" && Peek().kind == Token::Kind::kOperator)) {
          return Error(Code::kInvalidArgument, "line {}: , or ) after a parameter", line_);
        }
      }
      if (Status s = Expect(Token::Kind::kEnd, ""); !s.ok()) return s;
      Result<Body> body = ParseBody({"endmacro"});
      if (!body.ok()) return body.status();
      n.body = std::move(*body);
      if (Status s = Closing("endmacro"); !s.ok()) return s;
      return n;
    }
    if (keyword == "break" || keyword == "continue") {
      n.kind = keyword == "break" ? Node::Kind::kBreak : Node::Kind::kContinue;
      if (Status s = Expect(Token::Kind::kEnd, ""); !s.ok()) return s;
      return n;
    }
    if (keyword == "generation") {  // Hugging Face's marker of the assistant's text: its body
      if (Status s = Expect(Token::Kind::kEnd, ""); !s.ok()) return s;
      Result<Body> body = ParseBody({"endgeneration"});
      if (!body.ok()) return body.status();
      if (Status s = Closing("endgeneration"); !s.ok()) return s;
      n.kind = Node::Kind::kIf;  // an `if true` around the body
      auto yes = std::make_unique<Expr>();
      yes->literal = Value::Bool(true);
      n.branches.emplace_back(std::move(yes), std::move(*body));
      return n;
    }
    return Error(Code::kInvalidArgument, "line {}: {{% {} %}} is not supported", line_, keyword);
  }

  std::vector<Piece> pieces_;
  size_t at_ = 0;
};

}  // namespace

Result<Body> ParseTemplate(const std::string& source) {
  Result<std::vector<Piece>> pieces = Lex(source);
  if (!pieces.ok()) return pieces.status();
  return Parser(std::move(*pieces)).Parse();
}

}  // namespace warmpool::chat
