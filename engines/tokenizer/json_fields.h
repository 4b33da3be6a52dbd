// Reading the loosely typed fields of a tokenizer.json: a missing or mistyped field reads as its
// fallback, and whether that is acceptable is the reader's decision.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace warmpool::tokenizer {

// An object's "type", or "" (null, not an object, no type).
inline std::string TypeOf(const nlohmann::json& j) {
  auto it = j.is_object() ? j.find("type") : j.end();
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// The field, or null when absent, by reference: a copy of a JSON value recurses once per level of
// nesting, and a hostile file's million nested brackets would overflow the stack.
inline const nlohmann::json& FieldOf(const nlohmann::json& j, const char* key) {
  static const nlohmann::json null_value;
  if (!j.is_object()) return null_value;
  auto it = j.find(key);
  return it == j.end() ? null_value : *it;
}

inline bool FlagOf(const nlohmann::json& j, const char* key, bool fallback) {
  auto it = j.is_object() ? j.find(key) : j.end();
  return it != j.end() && it->is_boolean() ? it->get<bool>() : fallback;
}

}  // namespace warmpool::tokenizer
