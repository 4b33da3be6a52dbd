// A template's expressions, evaluated as Python evaluates them (renderer.h).
#include <algorithm>
#include <cmath>

#include "engines/chat_template/renderer.h"

namespace warmpool::chat {

Result<Value> Renderer::Eval(const Expr& e) {
  if (!Step()) return OverBudget();
  switch (e.kind) {
    case Expr::Kind::kLiteral: return e.literal;
    case Expr::Kind::kName: return Lookup(e.name);
    case Expr::Kind::kList: {
      List items;
      for (const ExprPtr& item : e.items) {
        Result<Value> v = Eval(*item);
        if (!v.ok()) return v;
        items.push_back(std::move(*v));
      }
      return Value::MakeList(std::move(items));
    }
    case Expr::Kind::kDict: {
      Dict items;
      for (size_t i = 0; i + 1 < e.items.size(); i += 2) {
        Result<Value> key = Eval(*e.items[i]);
        if (!key.ok()) return key;
        if (key->kind != Value::Kind::kString) return Error(Code::kInvalidArgument, "line {}: dict keys are strings here", e.line);
        Result<Value> value = Eval(*e.items[i + 1]);
        if (!value.ok()) return value;
        items.emplace_back(key->text, std::move(*value));
      }
      return Value::MakeDict(std::move(items));
    }
    case Expr::Kind::kAttribute: {
      Result<Value> object = Eval(*e.a);
      if (!object.ok()) return object;
      if (!object->defined()) return Error(Code::kInvalidArgument, "line {}: .{} of an undefined value", e.line, e.name);
      return Attribute(*object, e.name);
    }
    case Expr::Kind::kIndex:
    case Expr::Kind::kSlice: return Subscript(e);
    case Expr::Kind::kCall: {
      Result<Value> callee = Eval(*e.a);
      if (!callee.ok()) return callee;
      if (callee->kind != Value::Kind::kCallable) {
        return Error(Code::kInvalidArgument, "line {}: a {} is not callable", e.line, callee->TypeName());
      }
      Result<Args> args = EvalArgs(e);
      if (!args.ok()) return args.status();
      Result<Value> v = (*callee->function)(*args);
      if (!v.ok() && v.status().message().find("line ") != 0) {
        return Error(v.status().code(), "line {}: {}", e.line, v.status().message());
      }
      return v;
    }
    case Expr::Kind::kFilter: {
      Result<Value> value = Eval(*e.a);
      if (!value.ok()) return value;
      Result<Args> args = EvalArgs(e);
      if (!args.ok()) return args.status();
      Result<Value> v = ApplyFilter(e.name, *value, *args, [this](uint64_t n) { return Step(n); });
      if (!v.ok()) return Error(v.status().code(), "line {}: {}", e.line, v.status().message());
      return v;
    }
    case Expr::Kind::kTest: {
      Result<Value> value = Eval(*e.a);
      if (!value.ok()) return value;
      Result<Args> args = EvalArgs(e);
      if (!args.ok()) return args.status();
      Result<bool> t = ApplyTest(e.name, *value, *args);
      if (!t.ok()) return Error(t.status().code(), "line {}: {}", e.line, t.status().message());
      return Value::Bool(*t != e.negated);
    }
    case Expr::Kind::kNegate: {
      Result<Value> v = Eval(*e.a);
      if (!v.ok()) return v;
      if (v->kind == Value::Kind::kInt || v->kind == Value::Kind::kBool) return Value::Int(-v->number() == 0 ? 0 : -static_cast<int64_t>(v->number()));
      if (v->kind == Value::Kind::kFloat) return Value::Float(-v->real);
      return Error(Code::kInvalidArgument, "line {}: cannot negate a {}", e.line, v->TypeName());
    }
    case Expr::Kind::kNot: {
      Result<Value> v = Eval(*e.a);
      if (!v.ok()) return v;
      return Value::Bool(!v->Truthy());
    }
    case Expr::Kind::kAnd:
    case Expr::Kind::kOr: {  // Python's: the operand that decided, not a boolean
      Result<Value> left = Eval(*e.a);
      if (!left.ok()) return left;
      if (left->Truthy() == (e.kind == Expr::Kind::kOr)) return left;
      return Eval(*e.b);
    }
    case Expr::Kind::kConditional: {
      Result<Value> condition = Eval(*e.c);
      if (!condition.ok()) return condition;
      if (condition->Truthy()) return Eval(*e.a);
      if (e.b) return Eval(*e.b);
      return Value{};
    }
    case Expr::Kind::kBinary: return Binary(e);
  }
  return Value{};
}

Result<Value> Renderer::Binary(const Expr& e) {
  Result<Value> a = Eval(*e.a);
  if (!a.ok()) return a;
  Result<Value> b = Eval(*e.b);
  if (!b.ok()) return b;
  const std::string& op = e.name;
  auto type_error = [&] {
    return Error(Code::kInvalidArgument, "line {}: {} {} {}: unsupported operands", e.line, a->TypeName(), op, b->TypeName());
  };
  if (op == "==") return Value::Bool(Equal(*a, *b));
  if (op == "!=") return Value::Bool(!Equal(*a, *b));
  if (op == "<" || op == ">" || op == "<=" || op == ">=") {
    Result<bool> less = op == "<" || op == ">=" ? Less(*a, *b) : Less(*b, *a);
    if (!less.ok()) return Error(Code::kInvalidArgument, "line {}: {}", e.line, less.status().message());
    return Value::Bool(op == "<" || op == ">" ? *less : !*less);
  }
  if (op == "in") {
    bool found = false;
    if (b->kind == Value::Kind::kString && a->kind == Value::Kind::kString) found = b->text.find(a->text) != std::string::npos;
    else if (b->kind == Value::Kind::kList) found = std::any_of(b->list->begin(), b->list->end(), [&](const Value& x) { return Equal(x, *a); });
    else if (b->is_mapping() && a->kind == Value::Kind::kString) found = b->Find(a->text) != nullptr;
    else return type_error();
    return Value::Bool(found != e.negated);
  }
  if (op == "~") {
    std::string text = a->Str() + b->Str();
    if (!Step(text.size() / 64)) return OverBudget();
    return Value::String(std::move(text));
  }
  if (op == "+" && a->kind == Value::Kind::kString && b->kind == Value::Kind::kString) {
    if (!Step((a->text.size() + b->text.size()) / 64)) return OverBudget();
    return Value::String(a->text + b->text);
  }
  if (op == "+" && a->kind == Value::Kind::kList && b->kind == Value::Kind::kList) {
    List items = *a->list;
    items.insert(items.end(), b->list->begin(), b->list->end());
    if (!Step(items.size())) return OverBudget();
    return Value::MakeList(std::move(items));
  }
  if (op == "*" && a->kind == Value::Kind::kString && b->kind == Value::Kind::kInt) {
    if (b->integer > 0 && a->text.size() * static_cast<uint64_t>(b->integer) > limits_.max_output_bytes) {
      return Error(Code::kInvalidArgument, "line {}: a string of more than {} bytes", e.line, limits_.max_output_bytes);
    }
    std::string text;
    for (int64_t i = 0; i < b->integer; i++) text += a->text;
    return Value::String(std::move(text));
  }
  if (!a->is_number() || !b->is_number()) return type_error();
  // Python: int ** a negative int is a float; / always is.
  const bool real = a->kind == Value::Kind::kFloat || b->kind == Value::Kind::kFloat || op == "/" ||
                    (op == "**" && b->number() < 0);
  const double x = a->number(), y = b->number();
  if ((op == "/" || op == "//" || op == "%") && y == 0) return Error(Code::kInvalidArgument, "line {}: division by zero", e.line);
  if (real) {
    double r = op == "+" ? x + y : op == "-" ? x - y : op == "*" ? x * y : op == "/" ? x / y
             : op == "//" ? std::floor(x / y) : op == "%" ? x - y * std::floor(x / y) : std::pow(x, y);
    return Value::Float(r);
  }
  const int64_t i = static_cast<int64_t>(x), j = static_cast<int64_t>(y);
  int64_t r = 0;
  if (op == "+" && __builtin_add_overflow(i, j, &r)) return Error(Code::kInvalidArgument, "line {}: integer overflow", e.line);
  if (op == "-" && __builtin_sub_overflow(i, j, &r)) return Error(Code::kInvalidArgument, "line {}: integer overflow", e.line);
  if (op == "*" && __builtin_mul_overflow(i, j, &r)) return Error(Code::kInvalidArgument, "line {}: integer overflow", e.line);
  if (op == "//") r = i / j - ((i % j != 0) && ((i < 0) != (j < 0)));  // Python floors
  if (op == "%") r = ((i % j) + j) % j;
  if (op == "**") {
    r = 1;
    for (int64_t k = 0; k < j; k++) {
      if (__builtin_mul_overflow(r, i, &r)) return Error(Code::kInvalidArgument, "line {}: integer overflow", e.line);
      if (r == 0 || r == 1) break;
    }
  }
  return Value::Int(r);
}

// Python's indexing: negative from the end; slices clamp, with a step (-1 reverses).
Result<Value> Renderer::Subscript(const Expr& e) {
  Result<Value> object = Eval(*e.a);
  if (!object.ok()) return object;
  if (!object->defined()) return Error(Code::kInvalidArgument, "line {}: indexing an undefined value", e.line);
  std::vector<size_t> cps;
  int64_t size = 0;
  if (object->kind == Value::Kind::kList) {
    size = static_cast<int64_t>(object->list->size());
  } else if (object->kind == Value::Kind::kString) {
    cps = CodePoints(object->text);
    size = static_cast<int64_t>(cps.size()) - 1;
  }
  auto element = [&](int64_t i) {
    return object->kind == Value::Kind::kList ? (*object->list)[static_cast<size_t>(i)]
                                              : Value::String(object->text.substr(cps[static_cast<size_t>(i)], cps[static_cast<size_t>(i) + 1] - cps[static_cast<size_t>(i)]));
  };
  if (e.kind == Expr::Kind::kIndex) {
    Result<Value> index = Eval(*e.b);
    if (!index.ok()) return index;
    if (object->is_mapping()) {
      if (index->kind != Value::Kind::kString) return Value{};
      const Value* found = object->Find(index->text);
      return found != nullptr ? *found : Value{};
    }
    if (index->kind != Value::Kind::kInt || (object->kind != Value::Kind::kList && object->kind != Value::Kind::kString)) {
      return Error(Code::kInvalidArgument, "line {}: a {} indexed by a {}", e.line, object->TypeName(), index->TypeName());
    }
    const int64_t i = index->integer < 0 ? index->integer + size : index->integer;
    if (i < 0 || i >= size) return Value{};  // undefined, as Jinja's subscript of a missing item
    return element(i);
  }
  if (object->kind != Value::Kind::kList && object->kind != Value::Kind::kString) {
    return Error(Code::kInvalidArgument, "line {}: cannot slice a {}", e.line, object->TypeName());
  }
  int64_t bounds[3] = {0, 0, 1};
  const Expr* parts[3] = {e.b.get(), e.c.get(), e.items.empty() ? nullptr : e.items[0].get()};
  bool given[3] = {false, false, false};
  for (int k = 0; k < 3; k++) {
    if (parts[k] == nullptr) continue;
    Result<Value> v = Eval(*parts[k]);
    if (!v.ok()) return v;
    if (v->kind == Value::Kind::kNone) continue;
    if (v->kind != Value::Kind::kInt) return Error(Code::kInvalidArgument, "line {}: slice bounds are integers", e.line);
    bounds[k] = v->integer;
    given[k] = true;
  }
  const int64_t step = bounds[2];
  if (step == 0) return Error(Code::kInvalidArgument, "line {}: a slice step of 0", e.line);
  auto clamp = [&](int64_t v, bool is_given, int64_t fallback) {
    if (!is_given) return fallback;
    if (v < 0) v += size;
    if (step > 0) return std::clamp<int64_t>(v, 0, size);
    return std::clamp<int64_t>(v, -1, size - 1);
  };
  const int64_t start = clamp(bounds[0], given[0], step > 0 ? 0 : size - 1);
  const int64_t stop = clamp(bounds[1], given[1], step > 0 ? size : -1);
  List items;
  std::string text;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (!Step()) return OverBudget();
    if (object->kind == Value::Kind::kList) items.push_back(element(i));
    else text += element(i).text;
  }
  if (object->kind == Value::Kind::kList) return Value::MakeList(std::move(items));
  return Value::String(std::move(text));
}

}  // namespace warmpool::chat
