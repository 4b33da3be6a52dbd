// GPT-2's byte-level alphabet, which byte-level BPE tokenizers (GPT-2, Llama 3, Qwen) share: each of
// the 256 byte values is one printable Unicode character, so that any byte string is a string of
// symbols a vocabulary can hold. Printable Latin-1 bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') stand for
// themselves; the others, in byte order, are U+0100 onwards (a space is 'Ġ', U+0120).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace warmpool::tokenizer {

// The symbol (UTF-8) for one byte.
const std::string& ByteSymbol(uint8_t byte);
// bytes as a string of symbols.
std::string ToSymbols(std::string_view bytes);
// The bytes a string of symbols stands for; nullopt when a character is not in the alphabet.
std::optional<std::string> FromSymbols(std::string_view symbols);

}  // namespace warmpool::tokenizer
