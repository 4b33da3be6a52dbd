#include "http/numbers.h"

#include <charconv>
#include <string>

namespace warmpool::http {

namespace {

// What the client sent, quoted for the error text: bounded, and only printable ASCII.
std::string Quoted(std::string_view text) {
  constexpr size_t kMax = 32;
  std::string out;
  for (char c : text.substr(0, kMax)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  if (text.size() > kMax) out += "...";
  return out;
}

}  // namespace

Result<uint64_t> ParseDecimal(std::string_view text, std::string_view name, uint64_t min,
                              uint64_t max) {
  uint64_t value = 0;
  // from_chars alone takes no sign or space for an unsigned type, but it stops at the first
  // character that is not a digit: the whole text must be taken.
  const bool digits = !text.empty() && text[0] >= '0' && text[0] <= '9';
  auto [end, ec] = digits ? std::from_chars(text.data(), text.data() + text.size(), value)
                          : std::from_chars_result{text.data(), std::errc::invalid_argument};
  if (!digits || ec != std::errc() || end != text.data() + text.size() || value < min ||
      value > max) {
    return Error(Code::kInvalidArgument, "{} must be an integer from {} to {}, not \"{}\"", name,
                 min, max, Quoted(text));
  }
  return value;
}

}  // namespace warmpool::http
