// A Hugging Face tokenizer.json of a BPE model, in either of its two common styles: byte-level
// (GPT-2, Llama 3, Qwen, SmolLM: added tokens, the pre-tokenizer — a Split by regular expression,
// then ByteLevel; or ByteLevel with GPT-2's own expression —, the BPE model, and the ByteLevel
// decoder) or SentencePiece-style with byte fallback (Llama 2, Mistral, TinyLlama:
// engines/tokenizer/metaspace.h). What a file asks for that is
// not done here (another model type, a normalizer, other pre-tokenizers or decoders) is refused
// when it is read, by name, rather than encoded differently from the model's own tokenizer.
//
// Encoding: added tokens found in the text (longest first where two start at the same place) are
// their own ids, as Hugging Face's encode() treats them by default; the text between them is
// pre-tokenized, each piece turned into byte-level symbols and encoded by BPE.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "engines/tokenizer/added_tokens.h"
#include "engines/tokenizer/bpe.h"
#include "engines/tokenizer/metaspace.h"
#include "engines/tokenizer/post_processor.h"
#include "engines/tokenizer/pretokenizer.h"

namespace warmpool::tokenizer {


class Tokenizer {
 public:
  // tokenizer.json's text; source names it in errors, which are valid UTF-8 whatever the file holds.
  static Result<std::unique_ptr<Tokenizer>> Parse(std::string_view json_text, std::string_view source);
  static Result<std::unique_ptr<Tokenizer>> Load(const std::string& path);

  // INVALID_ARGUMENT when the text is not valid UTF-8. add_special_tokens: what the file's
  // post-processor puts around the text (Llama's BOS), as Hugging Face's encode() does by default;
  // a chat template renders its own, so prompts from one are encoded without.
  Result<std::vector<int32_t>> Encode(std::string_view text, bool add_special_tokens = false) const;
  // The bytes the tokens stand for, skipping special added tokens when asked. Ids outside the
  // vocabulary are INVALID_ARGUMENT. A cut-off sequence may end inside a UTF-8 character.
  Result<std::string> Decode(std::span<const int32_t> ids, bool skip_special = false) const;

  // The bytes the tokens stand for as they are, without the decoder's dropping of a leading
  // space: what a stream is made of (StreamingDecoder drops it once, at its start).
  Result<std::string> DecodePieces(std::span<const int32_t> ids, bool skip_special = false) const;
  bool strips_leading_space() const { return metaspace_ && metaspace_->strip_leading_space; }

  std::optional<int32_t> TokenId(std::string_view content) const;
  // One past the highest id.
  uint32_t vocab_size() const { return static_cast<uint32_t>(pieces_.size()); }
  const std::vector<AddedToken>& added_tokens() const { return added_.all(); }

 private:
  Tokenizer() = default;
  static Result<std::unique_ptr<Tokenizer>> ParseJson(std::string_view json_text, std::string_view source);
  Status EncodeText(std::string_view text, bool at_start, std::vector<int32_t>* ids) const;
  Result<std::string> PieceOf(const std::string& symbol, bool byte_fallback) const;

  std::optional<BpeModel> bpe_;
  std::optional<RegexSplitter> splitter_;  // byte-level style
  std::optional<Metaspace> metaspace_;     // SentencePiece style
  bool nfc_ = false;                       // byte-level style: text normalized to NFC first
  PostProcessor post_processor_;
  AddedTokens added_;
  std::unordered_map<std::string, int32_t> added_ids_;
  std::vector<std::string> pieces_;  // by id: the bytes each token stands for
  std::vector<bool> special_;        // by id
};

// Text from tokens as they come, never splitting a UTF-8 character: bytes that do not yet make a
// whole character wait for the next token. Finish returns what is left (invalid bytes as U+FFFD).
class StreamingDecoder {
 public:
  explicit StreamingDecoder(const Tokenizer& tokenizer, bool skip_special = true)
      : tokenizer_(tokenizer), skip_special_(skip_special) {}
  Result<std::string> Push(int32_t id);
  std::string Finish();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  std::string pending_;
  bool started_ = false;
};

}  // namespace warmpool::tokenizer
