// A JSON value from a user's file, described for an error message: scalars as written (cut at 64
// characters), objects and arrays by their kind only. nlohmann's dump() recurses once per level of
// nesting, so dumping a hostile file's million nested brackets would overflow the stack.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace warmpool {

inline std::string DescribeJson(const nlohmann::json& value) {
  if (value.is_structured()) return std::string(value.type_name());
  std::string text = value.dump();
  if (text.size() > 64) text = text.substr(0, 61) + "...";
  return text;
}

}  // namespace warmpool
