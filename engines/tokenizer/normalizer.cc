#include "engines/tokenizer/normalizer.h"

#include <cstdlib>

#include <utf8proc.h>

namespace warmpool::tokenizer {

Result<std::string> NormalizeNfc(std::string_view text) {
  if (text.empty()) return std::string();
  utf8proc_uint8_t* out = nullptr;
  // The length is given, so a U+0000 in the text is a character like any other.
  const utf8proc_ssize_t length =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()), static_cast<utf8proc_ssize_t>(text.size()),
                   &out, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (length < 0) {
    return Error(length == UTF8PROC_ERROR_NOMEM ? Code::kResourceExhausted : Code::kInvalidArgument,
                 "normalizing the text: {}", utf8proc_errmsg(length));
  }
  std::string normalized(reinterpret_cast<const char*>(out), static_cast<size_t>(length));
  std::free(out);
  return normalized;
}

}  // namespace warmpool::tokenizer
