// Rendering a parsed template: statements run in order over a stack of scopes (a for loop and a
// macro call open one; `set` writes the innermost, as Jinja's scoping does), expressions evaluated
// as Python would (chat_template/value.h), with the steps and the text bounded.
#include <algorithm>
#include <cmath>
#include <map>

#include "engines/chat_template/builtins.h"
#include "engines/chat_template/chat_template.h"
#include "engines/chat_template/syntax.h"

namespace warmpool::chat {
namespace {

enum class Flow { kNormal, kBreak, kContinue };

class Renderer {
 public:
  Renderer(const RenderLimits& limits, Value context) : limits_(limits) {
    scopes_.emplace_back();
    for (auto& [key, value] : *context.dict) scopes_.back()[key] = value;
  }

  Result<std::string> Run(const Body& body) {
    Result<Flow> flow = Exec(body);
    if (!flow.ok()) return flow.status();
    return std::move(out_);
  }

 private:
  bool Step(uint64_t n = 1) {
    steps_ += n;
    return steps_ <= limits_.max_steps;
  }
  Status OverBudget() const {
    return Error(Code::kInvalidArgument, "the template took more than {} steps: it loops too long", limits_.max_steps);
  }

  Value Lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      if (auto found = it->find(name); found != it->end()) return found->second;
    }
    return Global(name);
  }

  Result<Flow> Exec(const Body& body) {
    for (const Node& n : body) {
      if (!Step()) return OverBudget();
      Result<Flow> flow = ExecOne(n);
      if (!flow.ok() || *flow != Flow::kNormal) return flow;
    }
    return Flow::kNormal;
  }

  Status Write(const std::string& text) {
    if (out_.size() + text.size() > limits_.max_output_bytes) {
      return Error(Code::kInvalidArgument, "the template wrote more than {} bytes", limits_.max_output_bytes);
    }
    out_ += text;
    return OkStatus();
  }

  Result<Flow> ExecOne(const Node& n) {
    switch (n.kind) {
      case Node::Kind::kText: {
        if (Status s = Write(n.text); !s.ok()) return s;
        return Flow::kNormal;
      }
      case Node::Kind::kOutput: {
        Result<Value> v = Eval(*n.expr);
        if (!v.ok()) return v.status();
        if (Status s = Write(v->Str()); !s.ok()) return s;
        return Flow::kNormal;
      }
      case Node::Kind::kIf:
        for (const auto& [condition, body] : n.branches) {
          if (condition) {
            Result<Value> c = Eval(*condition);
            if (!c.ok()) return c.status();
            if (!c->Truthy()) continue;
          }
          return Exec(body);
        }
        return Flow::kNormal;
      case Node::Kind::kSet: {
        Result<Value> v = Eval(*n.expr);
        if (!v.ok()) return v.status();
        if (n.attribute.empty()) {
          scopes_.back()[n.text] = std::move(*v);
          return Flow::kNormal;
        }
        Value target = Lookup(n.text);
        if (target.kind != Value::Kind::kNamespace) {
          return Error(Code::kInvalidArgument, "line {}: set {}.{}: {} is not a namespace", n.line, n.text, n.attribute, n.text);
        }
        for (auto& [key, value] : *target.dict) {
          if (key == n.attribute) {
            value = std::move(*v);
            return Flow::kNormal;
          }
        }
        target.dict->emplace_back(n.attribute, std::move(*v));
        return Flow::kNormal;
      }
      case Node::Kind::kMacro: {
        scopes_.back()[n.text] = Value::Callable([this, &n](const Args& args) { return CallMacro(n, args); });
        return Flow::kNormal;
      }
      case Node::Kind::kBreak: return Flow::kBreak;
      case Node::Kind::kContinue: return Flow::kContinue;
      case Node::Kind::kFor: return ExecFor(n);
    }
    return Flow::kNormal;
  }

  Result<Value> CallMacro(const Node& macro, const Args& args) {
    if (++calls_ > 64) return Error(Code::kInvalidArgument, "line {}: macros call each other more than 64 deep", macro.line);
    std::map<std::string, Value> scope;
    for (size_t i = 0; i < macro.targets.size(); i++) {
      const Value* keyword = args.Keyword(macro.targets[i]);
      if (i < args.positional.size()) {
        scope[macro.targets[i]] = args.positional[i];
      } else if (keyword != nullptr) {
        scope[macro.targets[i]] = *keyword;
      } else if (macro.defaults[i]) {
        Result<Value> d = Eval(*macro.defaults[i]);
        if (!d.ok()) return d.status();
        scope[macro.targets[i]] = *d;
      }
    }
    // A macro's text is its value: rendered apart, returned as a string.
    std::string saved;
    saved.swap(out_);
    scopes_.push_back(std::move(scope));
    Result<Flow> flow = Exec(macro.body);
    scopes_.pop_back();
    saved.swap(out_);
    calls_--;
    if (!flow.ok()) return flow.status();
    return Value::String(std::move(saved));
  }

  Result<Flow> ExecFor(const Node& n) {
    Result<Value> iterable = Eval(*n.expr);
    if (!iterable.ok()) return iterable.status();
    List items;
    if (iterable->kind == Value::Kind::kList) {
      items = *iterable->list;
    } else if (iterable->is_mapping()) {
      for (const auto& [key, value] : *iterable->dict) items.push_back(Value::String(key));
    } else if (iterable->kind == Value::Kind::kString) {
      const std::vector<size_t> cps = CodePoints(iterable->text);
      for (size_t i = 0; i + 1 < cps.size(); i++) items.push_back(Value::String(iterable->text.substr(cps[i], cps[i + 1] - cps[i])));
    } else if (iterable->defined() && iterable->kind != Value::Kind::kNone) {
      return Error(Code::kInvalidArgument, "line {}: cannot loop over a {}", n.line, iterable->TypeName());
    } else if (!iterable->defined()) {
      return Error(Code::kInvalidArgument, "line {}: the loop's sequence is undefined", n.line);
    } else {
      return Error(Code::kInvalidArgument, "line {}: cannot loop over none", n.line);
    }
    scopes_.emplace_back();
    auto bind = [&](const Value& item) -> Status {
      if (n.targets.size() == 1) {
        scopes_.back()[n.targets[0]] = item;
        return OkStatus();
      }
      if (item.kind != Value::Kind::kList || item.list->size() != n.targets.size()) {
        return Error(Code::kInvalidArgument, "line {}: cannot unpack a {} into {} names", n.line, item.TypeName(), n.targets.size());
      }
      for (size_t k = 0; k < n.targets.size(); k++) scopes_.back()[n.targets[k]] = (*item.list)[k];
      return OkStatus();
    };
    if (n.filter) {  // the `if` of the loop: items it refuses are not part of it (loop.length)
      List kept;
      for (const Value& item : items) {
        if (!Step()) return OverBudget();
        if (Status s = bind(item); !s.ok()) return s;
        Result<Value> keep = Eval(*n.filter);
        if (!keep.ok()) return keep.status();
        if (keep->Truthy()) kept.push_back(item);
      }
      items = std::move(kept);
    }
    Result<Flow> result = Flow::kNormal;
    for (size_t i = 0; i < items.size(); i++) {
      if (!Step()) return OverBudget();
      if (Status s = bind(items[i]); !s.ok()) return s;
      const int64_t length = static_cast<int64_t>(items.size()), index = static_cast<int64_t>(i);
      Dict loop = {{"index", Value::Int(index + 1)},
                   {"index0", Value::Int(index)},
                   {"revindex", Value::Int(length - index)},
                   {"revindex0", Value::Int(length - index - 1)},
                   {"first", Value::Bool(i == 0)},
                   {"last", Value::Bool(i + 1 == items.size())},
                   {"length", Value::Int(length)},
                   {"previtem", i > 0 ? items[i - 1] : Value{}},
                   {"nextitem", i + 1 < items.size() ? items[i + 1] : Value{}}};
      scopes_.back()["loop"] = Value::MakeDict(std::move(loop));
      result = Exec(n.body);
      if (!result.ok()) break;
      if (*result == Flow::kBreak) break;
    }
    scopes_.pop_back();
    if (!result.ok()) return result;
    if (items.empty()) return Exec(n.otherwise);
    return Flow::kNormal;
  }

  Result<Args> EvalArgs(const Expr& e, size_t skip = 0) {
    Args args;
    const size_t positional = e.items.size() - e.keywords.size();
    for (size_t i = skip; i < e.items.size(); i++) {
      Result<Value> v = Eval(*e.items[i]);
      if (!v.ok()) return v.status();
      if (i < positional) args.positional.push_back(std::move(*v));
      else args.keywords.emplace_back(e.keywords[i - positional], std::move(*v));
    }
    return args;
  }

  Result<Value> Eval(const Expr& e);
  Result<Value> Binary(const Expr& e);
  Result<Value> Subscript(const Expr& e);

  const RenderLimits& limits_;
  std::vector<std::map<std::string, Value>> scopes_;
  std::string out_;
  uint64_t steps_ = 0;
  int calls_ = 0;
};

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

}  // namespace

Result<ChatTemplate> ChatTemplate::Parse(const std::string& source) {
  Result<Body> body = ParseTemplate(source);
  if (!body.ok()) return Error(Code::kInvalidArgument, "chat template: {}", body.status().message());
  ChatTemplate t;
  t.body_ = std::make_shared<const Body>(std::move(*body));
  return t;
}

Result<std::string> ChatTemplate::Render(const nlohmann::ordered_json& context, const RenderLimits& limits) const {
  Value variables = context.is_object() ? FromJson(context) : Value::MakeDict();
  Result<std::string> out = Renderer(limits, std::move(variables)).Run(*body_);
  if (!out.ok()) return Error(Code::kInvalidArgument, "chat template: {}", out.status().message());
  return out;
}

}  // namespace warmpool::chat
