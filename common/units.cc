#include "common/units.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <string>

namespace warmpool {

Result<uint64_t> ParseSize(std::string_view text) {
  std::string s(text);
  size_t pos = 0;
  while (pos < s.size() && (std::isdigit(static_cast<unsigned char>(s[pos])) || s[pos] == '.')) pos++;
  if (pos == 0) {
    return Error(Code::kInvalidArgument, "size \"{}\" must start with a number, e.g. 512MiB or 2GiB",
                 text);
  }
  std::string digits = s.substr(0, pos);
  char* end = nullptr;
  double number = std::strtod(digits.c_str(), &end);
  if (end != digits.c_str() + digits.size()) {  // "1.2.3", "."
    return Error(Code::kInvalidArgument, "size \"{}\" is not a number, e.g. 512MiB or 1.5GiB",
                 text);
  }
  std::string unit = s.substr(pos);
  while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());
  double scale = 0;
  if (unit.empty() || unit == "B") scale = 1;
  else if (unit == "KiB" || unit == "K" || unit == "k") scale = 1024.0;
  else if (unit == "MiB" || unit == "M") scale = 1024.0 * 1024;
  else if (unit == "GiB" || unit == "G") scale = 1024.0 * 1024 * 1024;
  else if (unit == "TiB" || unit == "T") scale = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "KB" || unit == "kB") scale = 1e3;
  else if (unit == "MB") scale = 1e6;
  else if (unit == "GB") scale = 1e9;
  else if (unit == "TB") scale = 1e12;
  if (scale == 0) {
    return Error(Code::kInvalidArgument,
                 "size \"{}\" has unknown unit \"{}\" (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)",
                 text, unit);
  }
  double bytes = number * scale;
  if (!std::isfinite(bytes) || bytes >= 1.8e19) {
    return Error(Code::kInvalidArgument, "size \"{}\" is too large", text);
  }
  // Not llround: values above INT64_MAX (up to the 1.8e19 limit) must not go through long long.
  return static_cast<uint64_t>(std::round(bytes));
}

Result<int64_t> ParseDurationMs(std::string_view text) {
  std::string s(text);
  if (s == "-1") return int64_t{-1};
  size_t pos = 0;
  while (pos < s.size() && (std::isdigit(static_cast<unsigned char>(s[pos])) || s[pos] == '.')) pos++;
  std::string digits = s.substr(0, pos);
  char* end = nullptr;
  double number = pos == 0 ? -1 : std::strtod(digits.c_str(), &end);
  if (pos == 0 || end != digits.c_str() + digits.size()) {
    return Error(Code::kInvalidArgument, "duration \"{}\" must be a number with an optional unit "
                 "(ms, s, m, h), e.g. 5m, or -1 for forever", text);
  }
  std::string unit = s.substr(pos);
  double scale = 0;
  if (unit.empty() || unit == "s") scale = 1000;
  else if (unit == "ms") scale = 1;
  else if (unit == "m") scale = 60000;
  else if (unit == "h") scale = 3600000;
  if (scale == 0) {
    return Error(Code::kInvalidArgument, "duration \"{}\" has unknown unit \"{}\" (ms, s, m, h)", text, unit);
  }
  double ms = number * scale;
  if (!std::isfinite(ms) || ms > 1e15) return Error(Code::kInvalidArgument, "duration \"{}\" is too long", text);
  return static_cast<int64_t>(std::llround(ms));
}

std::string FormatBytes(uint64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    unit++;
  }
  if (unit == 0) return fmt::format("{} B", bytes);
  return fmt::format("{:.1f} {}", value, kUnits[unit]);
}

}  // namespace warmpool
