#include "common/utf8.h"

#include <cstdint>

namespace warmpool {

size_t Utf8SequenceLength(std::string_view text) {
  const auto lead = static_cast<unsigned char>(text[0]);
  const size_t n = lead < 0x80 ? 1 : (lead >> 5) == 0x6 ? 2 : (lead >> 4) == 0xE ? 3 : (lead >> 3) == 0x1E ? 4 : 0;
  if (n == 0 || n > text.size()) return 0;
  uint32_t cp = n == 1 ? lead : n == 2 ? lead & 0x1Fu : n == 3 ? lead & 0x0Fu : lead & 0x07u;
  for (size_t i = 1; i < n; i++) {
    const auto c = static_cast<unsigned char>(text[i]);
    if ((c >> 6) != 0x2) return 0;
    cp = cp << 6 | (c & 0x3Fu);
  }
  const uint32_t min[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < min[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return n;
}

bool IsValidUtf8(std::string_view text) {
  while (!text.empty()) {
    const size_t n = Utf8SequenceLength(text);
    if (n == 0) return false;
    text.remove_prefix(n);
  }
  return true;
}

std::string ValidUtf8(std::string text) {
  for (size_t i = 0; i < text.size();) {
    size_t n = Utf8SequenceLength(std::string_view(text).substr(i));
    if (n == 0) {
      text[i] = '?';
      n = 1;
    }
    i += n;
  }
  return text;
}

Status ValidUtf8(Status status) {
  if (status.ok()) return status;
  return Status(status.code(), ValidUtf8(status.message()));
}

}  // namespace warmpool
