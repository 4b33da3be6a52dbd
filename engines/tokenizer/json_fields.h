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

inline bool FlagOf(const nlohmann::json& j, const char* key, bool fallback) {
  auto it = j.is_object() ? j.find(key) : j.end();
  return it != j.end() && it->is_boolean() ? it->get<bool>() : fallback;
}

}  // namespace warmpool::tokenizer
