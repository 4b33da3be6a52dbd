// The Unicode normalizer a tokenizer.json may ask for before pre-tokenizing (Qwen2's asks for NFC:
// "e" followed by a combining acute accent becomes "é", one code point, and so one token),
// computed by utf8proc (Debian's libutf8proc).
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"

namespace warmpool::tokenizer {

// text in Unicode normalization form C; INVALID_ARGUMENT when it is not valid UTF-8.
Result<std::string> NormalizeNfc(std::string_view text);

}  // namespace warmpool::tokenizer
