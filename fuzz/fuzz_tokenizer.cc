// The tokenizer on hostile text and hostile tokenizer.json files.
//
// Input: a first byte choosing the mode (its value modulo 3), then the rest.
//   0: the rest is text for a fixed byte-level BPE tokenizer (Llama 3's pre-tokenizer pattern, a
//      few merges, two added tokens). Valid UTF-8 must encode and decode back to itself, at once
//      and through the streaming decoder (whose pieces are valid UTF-8); anything else must be
//      INVALID_ARGUMENT, never a crash.
//   1: the rest is a tokenizer.json: parsing it either fails with INVALID_ARGUMENT and a valid
//      UTF-8 message, or gives a tokenizer that encodes a sample text and decodes what it made.
//   2: the rest is text for a fixed SentencePiece-style tokenizer (byte fallback, Llama 2's legacy
//      normalizer): valid UTF-8 encodes, and the stream decodes to what Decode gives (a '▁' in the
//      text or an added token in it need not come back as it was, as with Hugging Face's).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/utf8.h"
#include "engines/tokenizer/byte_level.h"
#include "engines/tokenizer/tokenizer.h"
#include "fuzz/fixed_tokenizer.h"
#include "fuzz/fuzz_check.h"

namespace {

using warmpool::Code;
using warmpool::ValidUtf8;
using namespace warmpool::tokenizer;

const Tokenizer& Fixed() {
  static const std::unique_ptr<Tokenizer> tokenizer = [] {
    auto parsed = Tokenizer::Parse(warmpool::fuzz::ByteLevelTokenizerJson(), "fixed");
    FUZZ_CHECK(parsed.ok());
    return std::move(*parsed);
  }();
  return *tokenizer;
}

const Tokenizer& FixedSentencePiece() {
  static const std::unique_ptr<Tokenizer> tokenizer = [] {
    nlohmann::json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
    for (int b = 0; b < 256; ++b) vocab[fmt::format("<0x{:02X}>", b)] = 3 + b;
    vocab["\u2581"] = 259;
    vocab["a"] = 260;
    vocab["b"] = 261;
    vocab["\u2581a"] = 262;
    vocab["\u2581ab"] = 263;
    const std::string metaspace = "\u2581";
    nlohmann::json json = {
        {"added_tokens",
         {{{"id", 0}, {"content", "<unk>"}, {"special", true}},
          {{"id", 1}, {"content", "<s>"}, {"special", true}},
          {{"id", 2}, {"content", "</s>"}, {"special", true}}}},
        {"normalizer",
         {{"type", "Sequence"},
          {"normalizers",
           {{{"type", "Prepend"}, {"prepend", metaspace}},
            {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", metaspace}}}}}},
        {"pre_tokenizer", nullptr},
        {"decoder",
         {{"type", "Sequence"},
          {"decoders",
           {{{"type", "Replace"}, {"pattern", {{"String", metaspace}}}, {"content", " "}},
            {{"type", "ByteFallback"}},
            {{"type", "Fuse"}},
            {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
        {"model",
         {{"type", "BPE"}, {"unk_token", "<unk>"}, {"fuse_unk", true}, {"byte_fallback", true}, {"vocab", vocab},
          {"merges", nlohmann::json::array({nlohmann::json::array({metaspace, "a"}),
                                            nlohmann::json::array({metaspace + "a", "b"})})}}}};
    auto parsed = Tokenizer::Parse(json.dump(), "fixed sentencepiece");
    if (!parsed.ok()) std::fprintf(stderr, "%s\n", parsed.status().ToString().c_str());
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

// The text a stream of ids decodes to; every piece of it valid UTF-8.
std::string Streamed(const Tokenizer& tokenizer, const std::vector<int32_t>& ids) {
  StreamingDecoder stream(tokenizer, /*skip_special=*/false);
  std::string streamed;
  for (int32_t id : ids) {
    auto piece = stream.Push(id);
    FUZZ_CHECK(piece.ok() && IsValidUtf8(*piece));
    streamed += *piece;
  }
  return streamed + stream.Finish();
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
  FUZZ_CHECK(Streamed(tokenizer, *ids) == text);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  if (data[0] % 3 == 0) {
    RoundTrip(Fixed(), rest);
    return 0;
  }
  if (data[0] % 3 == 2) {
    const Tokenizer& sp = FixedSentencePiece();
    auto ids = sp.Encode(rest);
    FUZZ_CHECK(ids.ok() == IsValidUtf8(rest));
    if (!ids.ok()) return 0;
    auto decoded = sp.Decode(*ids);
    FUZZ_CHECK(decoded.ok());
    FUZZ_CHECK(Streamed(sp, *ids) == *decoded);
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
