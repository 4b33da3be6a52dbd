// A chat template as a tree: the Jinja subset Hugging Face's chat templates use, parsed once when
// a model is read. Statements: text, {{ output }}, if/elif/else, for (tuple targets, `if` filter,
// else, the loop variable, break and continue), set (a name, a namespace's attribute), macro, and
// generation (Hugging Face's marker, rendered as its body). Expressions: literals (strings,
// numbers, true/false/none, lists, dicts), names, attributes, subscripts and slices, calls with
// keyword arguments, filters, tests (`is`, `is not`), unary and binary operators with Jinja's
// precedence, `in`, `not in`, `~` and the conditional expression.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "engines/chat_template/value.h"

namespace warmpool::chat {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral, kName, kList, kDict, kAttribute, kIndex, kSlice, kCall, kFilter, kTest,
    kNegate, kNot, kBinary, kAnd, kOr, kConditional,
  };
  Kind kind = Kind::kLiteral;
  Value literal;              // kLiteral
  std::string name;           // kName, kAttribute, kFilter, kTest; kBinary: the operator
  bool negated = false;       // kTest: `is not`; kBinary "in": `not in`
  ExprPtr a, b, c;            // operands: the object, the index/slice bounds, a condition
  std::vector<ExprPtr> items;              // kList, kDict (key, value, ...), call/filter/test args
  std::vector<std::string> keywords;       // names of the trailing keyword arguments in items
  size_t line = 0;
};

struct Node;
using Body = std::vector<Node>;

struct Node {
  enum class Kind { kText, kOutput, kIf, kFor, kSet, kMacro, kBreak, kContinue };
  Kind kind = Kind::kText;
  std::string text;    // kText; kSet: the name; kMacro: its name
  std::string attribute;  // kSet of `ns.attribute`
  ExprPtr expr;        // kOutput, kSet's value, kFor's iterable
  ExprPtr filter;      // kFor's `if`
  std::vector<std::string> targets;  // kFor; kMacro: its parameters
  std::vector<ExprPtr> defaults;     // kMacro: the parameters' defaults (nullptr: none)
  std::vector<std::pair<ExprPtr, Body>> branches;  // kIf: condition and body; else: no condition
  Body body, otherwise;  // kFor's body and else; kMacro's body
  size_t line = 0;
};

// Hugging Face renders with trim_blocks and lstrip_blocks, and Jinja drops one trailing newline of
// the source: so does this. Errors name the line: INVALID_ARGUMENT.
Result<Body> ParseTemplate(const std::string& source);

}  // namespace warmpool::chat
