#include "engines/tokenizer/byte_level.h"

#include <array>
#include <unordered_map>

namespace warmpool::tokenizer {
namespace {

std::string Utf8(uint32_t code_point) {
  std::string out;
  if (code_point < 0x80) {
    out += static_cast<char>(code_point);
  } else {  // the alphabet stays below U+0800: two bytes
    out += static_cast<char>(0xC0 | (code_point >> 6));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  }
  return out;
}

struct Alphabet {
  std::array<std::string, 256> symbol;
  std::unordered_map<std::string, uint8_t> byte;

  Alphabet() {
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      symbol[b] = Utf8(printable ? b : next++);
      byte[symbol[b]] = static_cast<uint8_t>(b);
    }
  }
};

const Alphabet& TheAlphabet() {
  static const Alphabet alphabet;
  return alphabet;
}

}  // namespace

const std::string& ByteSymbol(uint8_t byte) { return TheAlphabet().symbol[byte]; }

std::string ToSymbols(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) out += ByteSymbol(static_cast<uint8_t>(c));
  return out;
}

std::optional<std::string> FromSymbols(std::string_view symbols) {
  const Alphabet& a = TheAlphabet();
  std::string out;
  size_t i = 0;
  while (i < symbols.size()) {
    // Symbols are one or two bytes of UTF-8.
    const size_t length = (static_cast<uint8_t>(symbols[i]) & 0x80) == 0 ? 1 : 2;
    auto it = a.byte.find(std::string(symbols.substr(i, length)));
    if (it == a.byte.end()) return std::nullopt;
    out += static_cast<char>(it->second);
    i += length;
  }
  return out;
}

}  // namespace warmpool::tokenizer
