#include "engines/chat_template/builtins.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>

#include <fmt/format.h>

namespace warmpool::chat {
namespace {

// Python's str.strip family: whitespace, or the characters given.
std::string Strip(const std::string& s, const Value* chars, bool left, bool right) {
  auto drop = [&](char c) {
    return chars != nullptr && chars->kind == Value::Kind::kString ? chars->text.find(c) != std::string::npos : IsSpace(c);
  };
  size_t begin = 0, end = s.size();
  while (left && begin < end && drop(s[begin])) begin++;
  while (right && end > begin && drop(s[end - 1])) end--;
  return s.substr(begin, end - begin);
}

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c);
  return s;
}
std::string Upper(std::string s) {
  for (char& c : s) c = static_cast<char>(c >= 'a' && c <= 'z' ? c - 32 : c);
  return s;
}

Result<Value> StringMethod(const std::string& s, std::string_view name, const Args& args) {
  const Value& a0 = Arg(args, 0, "");
  auto text_arg = [&]() -> Result<std::string> {
    if (a0.kind != Value::Kind::kString) return Error(Code::kInvalidArgument, "{}() takes a string", name);
    return a0.text;
  };
  if (name == "strip") return Value::String(Strip(s, a0.defined() ? &a0 : nullptr, true, true));
  if (name == "lstrip") return Value::String(Strip(s, a0.defined() ? &a0 : nullptr, true, false));
  if (name == "rstrip") return Value::String(Strip(s, a0.defined() ? &a0 : nullptr, false, true));
  if (name == "lower") return Value::String(Lower(s));
  if (name == "upper") return Value::String(Upper(s));
  if (name == "startswith" || name == "endswith") {
    Result<std::string> t = text_arg();
    if (!t.ok()) return t.status();
    return Value::Bool(name == "startswith" ? s.starts_with(*t) : s.ends_with(*t));
  }
  if (name == "replace") {
    const Value& with = Arg(args, 1, "");
    if (a0.kind != Value::Kind::kString || with.kind != Value::Kind::kString) {
      return Error(Code::kInvalidArgument, "replace() takes two strings");
    }
    if (a0.text.empty()) return Value::String(s);
    std::string out;
    size_t at = 0;
    for (size_t found; (found = s.find(a0.text, at)) != std::string::npos; at = found + a0.text.size()) {
      out += s.substr(at, found - at) + with.text;
    }
    return Value::String(out + s.substr(at));
  }
  if (name == "split") {
    List parts;
    if (!a0.defined() || a0.kind == Value::Kind::kNone) {  // runs of whitespace
      size_t i = 0;
      while (i < s.size()) {
        while (i < s.size() && IsSpace(s[i])) i++;
        size_t j = i;
        while (j < s.size() && !IsSpace(s[j])) j++;
        if (j > i) parts.push_back(Value::String(s.substr(i, j - i)));
        i = j;
      }
      return Value::MakeList(std::move(parts));
    }
    Result<std::string> sep = text_arg();
    if (!sep.ok()) return sep.status();
    if (sep->empty()) return Error(Code::kInvalidArgument, "split() of an empty separator");
    size_t at = 0;
    for (size_t found; (found = s.find(*sep, at)) != std::string::npos; at = found + sep->size()) {
      parts.push_back(Value::String(s.substr(at, found - at)));
    }
    parts.push_back(Value::String(s.substr(at)));
    return Value::MakeList(std::move(parts));
  }
  if (name == "title" || name == "capitalize") {
    std::string out = Lower(s);
    for (size_t i = 0; i < out.size(); i++) {
      const bool starts = i == 0 || (name == "title" && !std::isalpha(static_cast<unsigned char>(out[i - 1])));
      if (starts) out[i] = Upper(std::string(1, out[i]))[0];
    }
    return Value::String(out);
  }
  return Error(Code::kInvalidArgument, "strings have no method {}()", name);
}

Result<Value> DictMethod(const Value& d, std::string_view name, const Args& args) {
  List out;
  if (name == "items") {
    for (const auto& [k, v] : *d.dict) out.push_back(Value::MakeList({Value::String(k), v}));
    return Value::MakeList(std::move(out));
  }
  if (name == "keys" || name == "values") {
    for (const auto& [k, v] : *d.dict) out.push_back(name == "keys" ? Value::String(k) : v);
    return Value::MakeList(std::move(out));
  }
  if (name == "get") {
    const Value& key = Arg(args, 0, "");
    const Value* found = key.kind == Value::Kind::kString ? d.Find(key.text) : nullptr;
    if (found != nullptr) return *found;
    const Value& fallback = Arg(args, 1, "");
    return fallback.defined() ? fallback : Value::None();
  }
  return Error(Code::kInvalidArgument, "dicts have no method {}()", name);
}

}  // namespace

const Value& Arg(const Args& args, size_t i, std::string_view keyword) {
  static const Value kUndefined;
  if (i < args.positional.size()) return args.positional[i];
  const Value* k = keyword.empty() ? nullptr : args.Keyword(keyword);
  return k != nullptr ? *k : kUndefined;
}

Result<Value> CallMethod(const Value& value, std::string_view name, const Args& args) {
  if (value.kind == Value::Kind::kString) return StringMethod(value.text, name, args);
  if (value.kind == Value::Kind::kDict) return DictMethod(value, name, args);
  return Error(Code::kInvalidArgument, "a {} has no method {}()", value.TypeName(), name);
}

Result<List> Items(const Value& v) {
  if (v.kind == Value::Kind::kList) return *v.list;
  List items;
  if (v.is_mapping()) {
    for (const auto& [k, x] : *v.dict) items.push_back(Value::String(k));
  } else if (v.kind == Value::Kind::kString) {
    const std::vector<size_t> cps = CodePoints(v.text);
    for (size_t i = 0; i + 1 < cps.size(); i++) items.push_back(Value::String(v.text.substr(cps[i], cps[i + 1] - cps[i])));
  } else {
    return Error(Code::kInvalidArgument, "a {} is not a sequence", v.TypeName());
  }
  return items;
}

std::vector<size_t> CodePoints(const std::string& s) {
  std::vector<size_t> out;
  for (size_t i = 0; i < s.size(); i++) {
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) out.push_back(i);
  }
  out.push_back(s.size());
  return out;
}

Value Attribute(const Value& value, std::string_view name) {
  if (value.is_mapping()) {
    if (const Value* found = value.Find(name)) return *found;
    if (value.kind == Value::Kind::kNamespace) return Value{};
  }
  if (value.kind == Value::Kind::kString || value.kind == Value::Kind::kDict) {
    static constexpr std::string_view kString[] = {"strip", "lstrip", "rstrip", "lower", "upper", "startswith",
                                                    "endswith", "replace", "split", "title", "capitalize"};
    static constexpr std::string_view kDict[] = {"items", "keys", "values", "get"};
    const bool string = value.kind == Value::Kind::kString;
    const auto& names = string ? std::vector<std::string_view>(std::begin(kString), std::end(kString))
                               : std::vector<std::string_view>(std::begin(kDict), std::end(kDict));
    if (std::find(names.begin(), names.end(), name) == names.end()) return Value{};
    std::string method(name);
    return Value::Callable([value, method, string](const Args& args) {
      return string ? StringMethod(value.text, method, args) : DictMethod(value, method, args);
    });
  }
  return Value{};
}

Value Global(std::string_view name) {
  if (name == "raise_exception") {
    return Value::Callable([](const Args& args) -> Result<Value> {
      return Error(Code::kInvalidArgument, "{}", args.positional.empty() ? "raise_exception()" : args.positional[0].Str());
    });
  }
  if (name == "namespace" || name == "dict") {
    const Value::Kind kind = name == "namespace" ? Value::Kind::kNamespace : Value::Kind::kDict;
    return Value::Callable([kind](const Args& args) -> Result<Value> {
      Dict items;
      for (const auto& [k, v] : args.keywords) items.emplace_back(k, v);
      return Value::MakeDict(std::move(items), kind);
    });
  }
  if (name == "range") {
    return Value::Callable([](const Args& args) -> Result<Value> {
      int64_t bounds[3] = {0, 0, 1};
      for (const Value& a : args.positional) {
        if (a.kind != Value::Kind::kInt) return Error(Code::kInvalidArgument, "range() takes integers");
      }
      const size_t n = args.positional.size();
      if (n == 0 || n > 3) return Error(Code::kInvalidArgument, "range() takes 1 to 3 integers");
      if (n == 1) bounds[1] = args.positional[0].integer;
      for (size_t i = 0; n > 1 && i < n; i++) bounds[i] = args.positional[i].integer;
      if (bounds[2] == 0) return Error(Code::kInvalidArgument, "range() of a step 0");
      const int64_t count = std::max<int64_t>(0, (bounds[1] - bounds[0] + bounds[2] - (bounds[2] > 0 ? 1 : -1)) / bounds[2]);
      if (count > 100000) return Error(Code::kInvalidArgument, "range() of {} numbers: at most 100000", count);
      List items;
      for (int64_t i = 0; i < count; i++) items.push_back(Value::Int(bounds[0] + i * bounds[2]));
      return Value::MakeList(std::move(items));
    });
  }
  if (name == "strftime_now") {
    return Value::Callable([](const Args& args) -> Result<Value> {
      const Value& format = Arg(args, 0, "format");
      if (format.kind != Value::Kind::kString) return Error(Code::kInvalidArgument, "strftime_now() takes a format");
      const std::time_t now = std::time(nullptr);
      std::tm local{};
      localtime_r(&now, &local);
      char buf[256];
      const size_t n = std::strftime(buf, sizeof(buf), format.text.c_str(), &local);
      return Value::String(std::string(buf, n));
    });
  }
  return Value{};
}

}  // namespace warmpool::chat
