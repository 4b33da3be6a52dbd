// Jinja's filters and tests, as far as chat templates use them.
#include <algorithm>
#include <cmath>

#include "engines/chat_template/builtins.h"

namespace warmpool::chat {
namespace {

Result<Value> Length(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kString: return Value::Int(static_cast<int64_t>(CodePoints(v.text).size() - 1));
    case Value::Kind::kList: return Value::Int(static_cast<int64_t>(v.list->size()));
    case Value::Kind::kDict:
    case Value::Kind::kNamespace: return Value::Int(static_cast<int64_t>(v.dict->size()));
    default: return Error(Code::kInvalidArgument, "length of a {}", v.TypeName());
  }
}

// selectattr/rejectattr/map(attribute=): an item's attribute, dotted paths included.
Value Path(const Value& item, const std::string& path) {
  Value v = item;
  size_t at = 0;
  while (at <= path.size()) {
    const size_t dot = path.find('.', at);
    v = Attribute(v, path.substr(at, dot == std::string::npos ? std::string::npos : dot - at));
    if (dot == std::string::npos) break;
    at = dot + 1;
  }
  return v;
}

}  // namespace

Result<Value> ApplyFilter(std::string_view name, const Value& value, const Args& args, const StepFn& step) {
  const Value& a0 = Arg(args, 0, "");
  if (name == "trim") return CallMethod(value.kind == Value::Kind::kString ? value : Value::String(value.Str()), "strip", args);
  if (name == "lower" || name == "upper" || name == "title" || name == "capitalize") {
    return CallMethod(Value::String(value.Str()), name, {});
  }
  if (name == "length" || name == "count") return Length(value);
  if (name == "string") return Value::String(value.Str());
  if (name == "safe") return value;  // nothing is escaped: Hugging Face renders without autoescape
  if (name == "default" || name == "d") {
    const bool boolean = Arg(args, 1, "boolean").Truthy();
    if (!value.defined() || (boolean && !value.Truthy())) return a0.defined() ? a0 : Value::String("");
    return value;
  }
  if (name == "tojson") {
    const Value& indent = Arg(args, 0, "indent");
    if (indent.defined() && indent.kind != Value::Kind::kInt && indent.kind != Value::Kind::kNone) {
      return Error(Code::kInvalidArgument, "tojson(indent=) takes an integer");
    }
    const int width = indent.kind == Value::Kind::kInt ? static_cast<int>(std::clamp<int64_t>(indent.integer, 0, 16)) : -1;
    Result<std::string> json = ToJson(value, width, Arg(args, 2, "sort_keys").Truthy());
    if (!json.ok()) return json.status();
    if (!step(json->size() / 64)) return Error(Code::kInvalidArgument, "tojson: over the template's budget");
    return Value::String(std::move(*json));
  }
  if (name == "int") {
    if (value.is_number()) return Value::Int(static_cast<int64_t>(value.number()));
    if (value.kind == Value::Kind::kString) {
      char* end = nullptr;
      const long long i = std::strtoll(value.text.c_str(), &end, 10);
      return Value::Int(end != value.text.c_str() && *end == '\0' ? i : 0);
    }
    return Value::Int(0);
  }
  if (name == "float") return Value::Float(value.is_number() ? value.number() : 0.0);
  if (name == "abs") {
    if (value.kind == Value::Kind::kInt) return Value::Int(value.integer < 0 ? -value.integer : value.integer);
    if (value.is_number()) return Value::Float(std::fabs(value.number()));
    return Error(Code::kInvalidArgument, "abs of a {}", value.TypeName());
  }
  if (name == "items") {
    if (!value.is_mapping()) return Error(Code::kInvalidArgument, "items of a {}", value.TypeName());
    return CallMethod(Value::MakeDict(*value.dict), "items", {});
  }
  if (name == "replace") return CallMethod(Value::String(value.Str()), "replace", args);
  // Filters over sequences.
  Result<List> items = Items(value);
  if (!items.ok()) return items.status();
  if (!step(items->size())) return Error(Code::kInvalidArgument, "{}: over the template's budget", name);
  if (name == "list") return Value::MakeList(std::move(*items));
  if (name == "first" || name == "last") {
    if (items->empty()) return Value{};
    return name == "first" ? items->front() : items->back();
  }
  if (name == "reverse") {
    std::reverse(items->begin(), items->end());
    if (value.kind == Value::Kind::kString) {
      std::string out;
      for (const Value& c : *items) out += c.text;
      return Value::String(out);
    }
    return Value::MakeList(std::move(*items));
  }
  if (name == "join") {
    const std::string separator = a0.defined() ? a0.Str() : "";
    const Value& attribute = Arg(args, 1, "attribute");
    std::string out;
    for (size_t i = 0; i < items->size(); i++) {
      const Value& item = attribute.defined() ? Path((*items)[i], attribute.Str()) : (*items)[i];
      out += (i ? separator : "") + item.Str();
    }
    return Value::String(std::move(out));
  }
  if (name == "selectattr" || name == "rejectattr") {
    if (a0.kind != Value::Kind::kString) return Error(Code::kInvalidArgument, "{} needs an attribute name", name);
    List kept;
    for (const Value& item : *items) {
      const Value attribute = Path(item, a0.text);
      bool passes = attribute.Truthy();
      if (args.positional.size() >= 2) {
        Args rest;
        rest.positional.assign(args.positional.begin() + 2, args.positional.end());
        Result<bool> t = ApplyTest(args.positional[1].Str(), attribute, rest);
        if (!t.ok()) return t.status();
        passes = *t;
      }
      if (passes == (name == "selectattr")) kept.push_back(item);
    }
    return Value::MakeList(std::move(kept));
  }
  if (name == "map") {
    const Value& attribute = Arg(args, 99, "attribute");
    List mapped;
    for (const Value& item : *items) {
      if (attribute.defined()) {
        mapped.push_back(Path(item, attribute.Str()));
      } else if (a0.kind == Value::Kind::kString) {
        Args rest;
        rest.positional.assign(args.positional.begin() + 1, args.positional.end());
        Result<Value> v = ApplyFilter(a0.text, item, rest, step);
        if (!v.ok()) return v;
        mapped.push_back(std::move(*v));
      } else {
        return Error(Code::kInvalidArgument, "map needs a filter name or attribute=");
      }
    }
    return Value::MakeList(std::move(mapped));
  }
  if (name == "unique") {
    List out;
    for (const Value& item : *items) {
      if (std::none_of(out.begin(), out.end(), [&](const Value& x) { return Equal(x, item); })) out.push_back(item);
    }
    return Value::MakeList(std::move(out));
  }
  if (name == "sum") {
    Value total = Value::Int(0);
    for (const Value& item : *items) {
      if (!item.is_number()) return Error(Code::kInvalidArgument, "sum of a {}", item.TypeName());
      total = total.kind == Value::Kind::kInt && item.kind != Value::Kind::kFloat ? Value::Int(total.integer + static_cast<int64_t>(item.number()))
                                                                                  : Value::Float(total.number() + item.number());
    }
    return total;
  }
  if (name == "min" || name == "max") {
    if (items->empty()) return Value{};
    Value best = items->front();
    for (const Value& item : *items) {
      Result<bool> less = name == "min" ? Less(item, best) : Less(best, item);
      if (!less.ok()) return less.status();
      if (*less) best = item;
    }
    return best;
  }
  return Error(Code::kInvalidArgument, "no filter named \"{}\"", name);
}

Result<bool> ApplyTest(std::string_view name, const Value& v, const Args& args) {
  const Value& a0 = Arg(args, 0, "");
  if (name == "defined") return v.defined();
  if (name == "undefined") return !v.defined();
  if (name == "none") return v.kind == Value::Kind::kNone;
  if (name == "boolean") return v.kind == Value::Kind::kBool;
  if (name == "true") return v.kind == Value::Kind::kBool && v.boolean;
  if (name == "false") return v.kind == Value::Kind::kBool && !v.boolean;
  if (name == "string") return v.kind == Value::Kind::kString;
  if (name == "number") return v.is_number();  // Python's bool is a number too
  if (name == "integer") return v.kind == Value::Kind::kInt;
  if (name == "float") return v.kind == Value::Kind::kFloat;
  if (name == "mapping") return v.is_mapping();
  if (name == "sequence") return v.kind == Value::Kind::kList || v.kind == Value::Kind::kString || v.is_mapping();
  if (name == "iterable") return v.kind == Value::Kind::kList || v.kind == Value::Kind::kString || v.is_mapping();
  if (name == "callable") return v.kind == Value::Kind::kCallable;
  if (name == "equalto" || name == "eq" || name == "==" || name == "sameas") return Equal(v, a0);
  if (name == "ne" || name == "!=") return !Equal(v, a0);
  if (name == "in") {
    if (a0.kind == Value::Kind::kList) return std::any_of(a0.list->begin(), a0.list->end(), [&](const Value& x) { return Equal(x, v); });
    if (a0.kind == Value::Kind::kString && v.kind == Value::Kind::kString) return a0.text.find(v.text) != std::string::npos;
    if (a0.is_mapping() && v.kind == Value::Kind::kString) return a0.Find(v.text) != nullptr;
    return Error(Code::kInvalidArgument, "is in: not a container");
  }
  if (name == "odd" || name == "even") {
    if (v.kind != Value::Kind::kInt) return Error(Code::kInvalidArgument, "is {}: not an integer", name);
    return (v.integer % 2 != 0) == (name == "odd");
  }
  if (name == "lower" || name == "upper") {
    if (v.kind != Value::Kind::kString) return false;
    Result<Value> changed = CallMethod(v, name, {});
    return changed.ok() && changed->text == v.text;
  }
  return Error(Code::kInvalidArgument, "no test named \"{}\"", name);
}

}  // namespace warmpool::chat
