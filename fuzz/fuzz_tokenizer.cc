// The tokenizer on hostile text and hostile tokenizer.json files.
//
// Input: a first byte choosing the mode, then the rest.
//   even: the rest is text for a fixed byte-level BPE tokenizer (Llama 3's pre-tokenizer pattern, a
//         few merges, two added tokens). Valid UTF-8 must encode and decode back to itself, at once
//         and through the streaming decoder (whose pieces are valid UTF-8); anything else must be
//         INVALID_ARGUMENT, never a crash.
//   odd:  the rest is a tokenizer.json: parsing it either fails with INVALID_ARGUMENT and a valid
//         UTF-8 message, or gives a tokenizer that encodes a sample text and decodes what it made.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/utf8.h"
#include "engines/tokenizer/byte_level.h"
#include "engines/tokenizer/tokenizer.h"
#include "fuzz/fuzz_check.h"

namespace {

using warmpool::Code;
using warmpool::ValidUtf8;
using namespace warmpool::tokenizer;

const Tokenizer& Fixed() {
  static const std::unique_ptr<Tokenizer> tokenizer = [] {
    nlohmann::json vocab = nlohmann::json::object();
    for (int b = 0; b < 256; ++b) vocab[ByteSymbol(static_cast<uint8_t>(b))] = b;
    vocab["th"] = 256;
    vocab["Ġth"] = 257;
    vocab["Ġthe"] = 258;
    nlohmann::json json = {
        {"added_tokens",
         {{{"id", 259}, {"content", "<|end|>"}, {"special", true}},
          {{"id", 260}, {"content", "<|end|>>"}, {"special", true}}}},
        {"normalizer", nullptr},
        {"pre_tokenizer",
         {{"type", "Sequence"},
          {"pretokenizers",
           {{{"type", "Split"},
             {"pattern",
              {{"Regex", R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}}},
             {"behavior", "Isolated"}},
            {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}}},
        {"decoder", {{"type", "ByteLevel"}}},
        {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"t h", "Ġ th", "Ġth e"}}}}};
    auto parsed = Tokenizer::Parse(json.dump(), "fixed");
    FUZZ_CHECK(parsed.ok());
    return std::move(*parsed);
  }();
  return *tokenizer;
}

bool IsValidUtf8(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const size_t length = warmpool::Utf8SequenceLength(text.substr(i));
    if (length == 0) return false;
    i += length;
  }
  return true;
}

void RoundTrip(const Tokenizer& tokenizer, std::string_view text) {
  auto ids = tokenizer.Encode(text);
  if (!IsValidUtf8(text)) {
    FUZZ_CHECK(!ids.ok() && ids.status().code() == Code::kInvalidArgument);
    return;
  }
  FUZZ_CHECK(ids.ok());
  auto decoded = tokenizer.Decode(*ids);
  FUZZ_CHECK(decoded.ok() && *decoded == text);
  StreamingDecoder stream(tokenizer, /*skip_special=*/false);
  std::string streamed;
  for (int32_t id : *ids) {
    auto piece = stream.Push(id);
    FUZZ_CHECK(piece.ok() && IsValidUtf8(*piece));
    streamed += *piece;
  }
  streamed += stream.Finish();
  FUZZ_CHECK(streamed == text);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  if (data[0] % 2 == 0) {
    RoundTrip(Fixed(), rest);
    return 0;
  }
  auto parsed = Tokenizer::Parse(rest, "fuzzed");
  if (!parsed.ok()) {
    FUZZ_CHECK(parsed.status().code() == Code::kInvalidArgument || parsed.status().code() == Code::kResourceExhausted);
    FUZZ_CHECK(ValidUtf8(parsed.status().message()) == parsed.status().message());
    return 0;
  }
  auto ids = (*parsed)->Encode("Hello <|end|> wörld 123 🙂\n");
  if (ids.ok()) FUZZ_CHECK((*parsed)->Decode(*ids).ok());
  return 0;
}
