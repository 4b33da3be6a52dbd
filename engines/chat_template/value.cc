#include "engines/chat_template/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include <fmt/format.h>

namespace warmpool::chat {

const Value* Args::Keyword(std::string_view name) const {
  for (const auto& [key, value] : keywords) {
    if (key == name) return &value;
  }
  return nullptr;
}

Value Value::MakeList(List items) {
  Value v{Kind::kList};
  v.list = std::make_shared<List>(std::move(items));
  return v;
}

Value Value::MakeDict(Dict items, Kind kind) {
  Value v{kind};
  v.dict = std::make_shared<Dict>(std::move(items));
  return v;
}

Value Value::Callable(Function f) {
  Value v{Kind::kCallable};
  v.function = std::make_shared<Function>(std::move(f));
  return v;
}

bool Value::Truthy() const {
  switch (kind) {
    case Kind::kUndefined:
    case Kind::kNone: return false;
    case Kind::kBool: return boolean;
    case Kind::kInt: return integer != 0;
    case Kind::kFloat: return real != 0;
    case Kind::kString: return !text.empty();
    case Kind::kList: return !list->empty();
    case Kind::kDict: return !dict->empty();
    case Kind::kNamespace:
    case Kind::kCallable: return true;
  }
  return false;
}

const Value* Value::Find(std::string_view key) const {
  if (!is_mapping()) return nullptr;
  for (const auto& [k, v] : *dict) {
    if (k == key) return &v;
  }
  return nullptr;
}

std::string_view Value::TypeName() const {
  switch (kind) {
    case Kind::kUndefined: return "undefined";
    case Kind::kNone: return "none";
    case Kind::kBool: return "boolean";
    case Kind::kInt: return "integer";
    case Kind::kFloat: return "float";
    case Kind::kString: return "string";
    case Kind::kList: return "list";
    case Kind::kDict: return "dict";
    case Kind::kNamespace: return "namespace";
    case Kind::kCallable: return "callable";
  }
  return "?";
}

std::string FloatRepr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  // The shortest digits that round-trip, in scientific form, then laid out as Python's repr().
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string s(buf, end);
  const size_t e = s.find('e');
  const int exponent = std::atoi(s.c_str() + e + 1);
  std::string digits;
  bool negative = false;
  for (size_t i = 0; i < e; i++) {
    if (s[i] == '-') negative = true;
    else if (s[i] != '.') digits += s[i];
  }
  std::string out = negative ? "-" : "";
  if (exponent < -4 || exponent >= 16) {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    out += fmt::format("e{}{:02d}", exponent < 0 ? '-' : '+', std::abs(exponent));
    return out;
  }
  if (exponent < 0) return out + "0." + std::string(static_cast<size_t>(-exponent - 1), '0') + digits;
  const size_t point = static_cast<size_t>(exponent) + 1;
  if (digits.size() <= point) return out + digits + std::string(point - digits.size(), '0') + ".0";
  return out + digits.substr(0, point) + "." + digits.substr(point);
}

std::string Value::Str() const {
  switch (kind) {
    case Kind::kUndefined: return "";
    case Kind::kString: return text;
    default: return Repr();
  }
}

namespace {

// Python's repr() of a string: single quotes unless it holds one and no double quote.
std::string StringRepr(const std::string& s) {
  const char quote = s.find('\'') != std::string::npos && s.find('"') == std::string::npos ? '"' : '\'';
  std::string out(1, quote);
  for (unsigned char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == static_cast<unsigned char>(quote)) out += std::string("\\") + quote;
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7f) out += fmt::format("\\x{:02x}", c);
    else out += static_cast<char>(c);
  }
  return out + quote;
}

}  // namespace

std::string Value::Repr() const {
  switch (kind) {
    case Kind::kUndefined: return "";
    case Kind::kNone: return "None";
    case Kind::kBool: return boolean ? "True" : "False";
    case Kind::kInt: return std::to_string(integer);
    case Kind::kFloat: return FloatRepr(real);
    case Kind::kString: return StringRepr(text);
    case Kind::kList: {
      std::string out = "[";
      for (size_t i = 0; i < list->size(); i++) out += (i ? ", " : "") + (*list)[i].Repr();
      return out + "]";
    }
    case Kind::kDict: {
      std::string out = "{";
      for (size_t i = 0; i < dict->size(); i++) {
        out += (i ? ", " : "") + StringRepr((*dict)[i].first) + ": " + (*dict)[i].second.Repr();
      }
      return out + "}";
    }
    case Kind::kNamespace: return "<Namespace>";
    case Kind::kCallable: return "<function>";
  }
  return "";
}

bool Equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind == Value::Kind::kFloat || b.kind == Value::Kind::kFloat) return a.number() == b.number();
    return (a.kind == Value::Kind::kBool ? a.boolean : a.integer) == (b.kind == Value::Kind::kBool ? b.boolean : b.integer);
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone: return true;
    case Value::Kind::kString: return a.text == b.text;
    case Value::Kind::kList:
      return a.list->size() == b.list->size() &&
             std::equal(a.list->begin(), a.list->end(), b.list->begin(), [](const Value& x, const Value& y) { return Equal(x, y); });
    case Value::Kind::kDict:
      if (a.dict->size() != b.dict->size()) return false;
      for (const auto& [key, value] : *a.dict) {
        const Value* other = b.Find(key);
        if (other == nullptr || !Equal(value, *other)) return false;
      }
      return true;
    default: return a.dict == b.dict && a.function == b.function;
  }
}

Result<bool> Less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) return a.number() < b.number();
  if (a.kind == Value::Kind::kString && b.kind == Value::Kind::kString) return a.text < b.text;
  return Error(Code::kInvalidArgument, "cannot order a {} and a {}", a.TypeName(), b.TypeName());
}

Value FromJson(const nlohmann::ordered_json& json) {
  switch (json.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::None();
    case nlohmann::ordered_json::value_t::boolean: return Value::Bool(json.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value::Int(json.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned:
      return json.get<uint64_t>() <= INT64_MAX ? Value::Int(static_cast<int64_t>(json.get<uint64_t>()))
                                               : Value::Float(json.get<double>());
    case nlohmann::ordered_json::value_t::number_float: return Value::Float(json.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value::String(json.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List items;
      for (const nlohmann::ordered_json& item : json) items.push_back(FromJson(item));
      return Value::MakeList(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict items;
      for (const auto& [key, item] : json.items()) items.emplace_back(key, FromJson(item));
      return Value::MakeDict(std::move(items));
    }
    default: return Value{};
  }
}

namespace {

void JsonString(const std::string& s, std::string& out) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) out += fmt::format("\\u{:04x}", c);
        else out += static_cast<char>(c);
    }
  }
  out += '"';
}

Status WriteJson(const Value& v, int indent, bool sort_keys, int depth, std::string& out) {
  if (depth > 64) return Error(Code::kInvalidArgument, "tojson: nested too deep");
  const std::string newline = indent >= 0 ? "\n" + std::string(static_cast<size_t>(indent) * (depth + 1), ' ') : "";
  const std::string close = indent >= 0 ? "\n" + std::string(static_cast<size_t>(indent) * depth, ' ') : "";
  const char* comma = indent >= 0 ? "," : ", ";
  switch (v.kind) {
    case Value::Kind::kNone: out += "null"; return OkStatus();
    case Value::Kind::kBool: out += v.boolean ? "true" : "false"; return OkStatus();
    case Value::Kind::kInt: out += std::to_string(v.integer); return OkStatus();
    case Value::Kind::kFloat:
      out += std::isnan(v.real) ? "NaN" : std::isinf(v.real) ? (v.real > 0 ? "Infinity" : "-Infinity") : FloatRepr(v.real);
      return OkStatus();
    case Value::Kind::kString: JsonString(v.text, out); return OkStatus();
    case Value::Kind::kList:
      if (v.list->empty()) return out += "[]", OkStatus();
      out += "[";
      for (size_t i = 0; i < v.list->size(); i++) {
        out += (i ? comma : "") + newline;
        if (Status s = WriteJson((*v.list)[i], indent, sort_keys, depth + 1, out); !s.ok()) return s;
      }
      out += close + "]";
      return OkStatus();
    case Value::Kind::kDict:
    case Value::Kind::kNamespace: {
      if (v.dict->empty()) return out += "{}", OkStatus();
      std::vector<const std::pair<std::string, Value>*> entries;
      for (const auto& entry : *v.dict) entries.push_back(&entry);
      if (sort_keys) std::sort(entries.begin(), entries.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out += "{";
      for (size_t i = 0; i < entries.size(); i++) {
        out += (i ? comma : "") + newline;
        JsonString(entries[i]->first, out);
        out += ": ";
        if (Status s = WriteJson(entries[i]->second, indent, sort_keys, depth + 1, out); !s.ok()) return s;
      }
      out += close + "}";
      return OkStatus();
    }
    case Value::Kind::kUndefined: return Error(Code::kInvalidArgument, "tojson: an undefined value");
    case Value::Kind::kCallable: return Error(Code::kInvalidArgument, "tojson: a function is not JSON");
  }
  return OkStatus();
}

}  // namespace

Result<std::string> ToJson(const Value& value, int indent, bool sort_keys) {
  std::string out;
  if (Status s = WriteJson(value, indent, sort_keys, 0, out); !s.ok()) return s;
  return out;
}

}  // namespace warmpool::chat
