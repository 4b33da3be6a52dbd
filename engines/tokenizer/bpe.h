// A BPE model (Sennrich et al.; GPT-2's byte-level form): a vocabulary of symbols and a ranked
// list of merges. A word (one pre-tokenized piece, as symbols) starts as its characters; the
// adjacent pair whose merge ranks first is merged wherever it occurs, left to right, and again,
// until no adjacent pair has a merge. Each resulting symbol is a token.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/status.h"

namespace warmpool::tokenizer {

class BpeModel {
 public:
  struct Options {
    // A word that is in the vocabulary as a whole is that token, merges or not (Llama 3's).
    bool ignore_merges = false;
    // A character the vocabulary lacks starts as its bytes' tokens, "<0x41>" (SentencePiece's).
    bool byte_fallback = false;
    // What a symbol the vocabulary lacks becomes otherwise (none: an error); fuse_unk: a run of
    // them becomes one.
    std::optional<std::string> unk;
    bool fuse_unk = false;
  };
  // merges: pairs in rank order (the first merges first).
  static Result<BpeModel> Make(std::unordered_map<std::string, int32_t> vocab,
                               const std::vector<std::pair<std::string, std::string>>& merges, const Options& options,
                               std::string_view source);

  // Appends the tokens of one word; INVALID_ARGUMENT when a symbol it comes to is not in the
  // vocabulary (a byte-level vocabulary has every byte, so only a broken one gets here).
  Status Encode(std::string_view word, std::vector<int32_t>* ids) const;

  const std::unordered_map<std::string, int32_t>& vocab() const { return vocab_; }

 private:
  static std::string PairKey(std::string_view a, std::string_view b);

  std::unordered_map<std::string, int32_t> vocab_;
  std::unordered_map<std::string, uint32_t> ranks_;  // PairKey(a, b) -> rank
  Options options_;
};

}  // namespace warmpool::tokenizer
