// Rendering a parsed template (render.cc, evaluate.cc): statements run in order over a stack of
// scopes (a for loop and a macro call open one; `set` writes the innermost, as Jinja's scoping
// does), expressions evaluated as Python would (value.h), with the steps and the text bounded.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "engines/chat_template/builtins.h"
#include "engines/chat_template/chat_template.h"
#include "engines/chat_template/syntax.h"

namespace warmpool::chat {

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

}  // namespace warmpool::chat
