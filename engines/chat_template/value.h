// The values a chat template computes with, as Jinja (and Python beneath it) sees them: undefined,
// none, booleans, integers, floats, strings, lists, dicts (string keys, in insertion order),
// namespaces (dicts whose attributes a template may set) and callables (macros, globals, bound
// methods). Lists and dicts are shared, as Python's objects are; templates never mutate them
// (Hugging Face renders in Jinja's immutable sandbox), except a namespace's attributes.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace warmpool::chat {

struct Value;
using List = std::vector<Value>;
using Dict = std::vector<std::pair<std::string, Value>>;

// Positional and keyword arguments of a call.
struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keywords;
  const Value* Keyword(std::string_view name) const;
};
using Function = std::function<Result<Value>(const Args& args)>;

struct Value {
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kNamespace, kCallable };
  Kind kind = Kind::kUndefined;
  bool boolean = false;
  int64_t integer = 0;
  double real = 0;
  std::string text;
  std::shared_ptr<List> list;
  std::shared_ptr<Dict> dict;  // a dict's or a namespace's
  std::shared_ptr<Function> function;

  static Value None() { return Value{Kind::kNone}; }
  static Value Bool(bool b) { Value v{Kind::kBool}; v.boolean = b; return v; }
  static Value Int(int64_t i) { Value v{Kind::kInt}; v.integer = i; return v; }
  static Value Float(double d) { Value v{Kind::kFloat}; v.real = d; return v; }
  static Value String(std::string s) { Value v{Kind::kString}; v.text = std::move(s); return v; }
  static Value MakeList(List items = {});
  static Value MakeDict(Dict items = {}, Kind kind = Kind::kDict);
  static Value Callable(Function f);

  bool defined() const { return kind != Kind::kUndefined; }
  bool is_number() const { return kind == Kind::kInt || kind == Kind::kFloat || kind == Kind::kBool; }
  bool is_mapping() const { return kind == Kind::kDict || kind == Kind::kNamespace; }
  double number() const { return kind == Kind::kFloat ? real : kind == Kind::kBool ? boolean : static_cast<double>(integer); }
  // Python's truth: empty strings, lists and dicts, 0, none and undefined are false.
  bool Truthy() const;
  // A dict's entry (nullptr when absent).
  const Value* Find(std::string_view key) const;
  // Python's str(): what `{{ value }}` writes (undefined: nothing).
  std::string Str() const;
  // Python's repr(), used inside str() of lists and dicts.
  std::string Repr() const;
  // The Kind's name for messages ("string", "list", ...).
  std::string_view TypeName() const;
};

// ==, as Python compares (1 == 1.0 == True; lists and dicts element by element).
bool Equal(const Value& a, const Value& b);
// <, for numbers and for strings; INVALID_ARGUMENT for anything else.
Result<bool> Less(const Value& a, const Value& b);

// JSON in (the request's messages, the template's context; ordered, as Python's dicts keep their
// keys in the order written), depth-bounded by the parser that made it; and out, as Hugging Face's tojson writes it (json.dumps with ensure_ascii=False).
Value FromJson(const nlohmann::ordered_json& json);
Result<std::string> ToJson(const Value& value, int indent = -1, bool sort_keys = false);
// Python's whitespace (str.strip, str.split) and Jinja's, between tokens and for {%- -%}.
inline bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// Python's repr() of a float: the shortest digits that round-trip, scientific outside 1e-4..1e16.
std::string FloatRepr(double d);

}  // namespace warmpool::chat
