#include "engines/tokenizer/bpe.h"

#include <limits>
#include <queue>

#include <fmt/format.h>

#include "common/utf8.h"

namespace warmpool::tokenizer {

std::string BpeModel::PairKey(std::string_view a, std::string_view b) {
  // Symbols are valid UTF-8, which never holds the byte 0xFF: it cannot be part of either half.
  std::string key(a);
  key += '\xFF';
  key += b;
  return key;
}

Result<BpeModel> BpeModel::Make(std::unordered_map<std::string, int32_t> vocab,
                                const std::vector<std::pair<std::string, std::string>>& merges, const Options& options,
                                std::string_view source) {
  BpeModel model;
  model.options_ = options;
  if (options.unk && vocab.find(*options.unk) == vocab.end()) {
    return Error(Code::kInvalidArgument, "{}: unk_token \"{}\" is not in the vocabulary", source, ValidUtf8(*options.unk));
  }
  if (options.byte_fallback) {
    for (int b = 0; b < 256; ++b) {
      if (vocab.find(fmt::format("<0x{:02X}>", b)) == vocab.end()) {
        return Error(Code::kInvalidArgument, "{}: byte_fallback without the token <0x{:02X}>", source, b);
      }
    }
  }
  uint32_t rank = 0;
  for (const auto& [a, b] : merges) {
    if (a.empty() || b.empty()) return Error(Code::kInvalidArgument, "{}: a merge has an empty half", source);
    if (vocab.find(a + b) == vocab.end()) {
      return Error(Code::kInvalidArgument, "{}: the merge of \"{}\" and \"{}\" makes a symbol the vocabulary lacks",
                   source, ValidUtf8(a), ValidUtf8(b));
    }
    if (vocab.find(a) == vocab.end() || vocab.find(b) == vocab.end()) {
      return Error(Code::kInvalidArgument, "{}: the merge of \"{}\" and \"{}\" has a half the vocabulary lacks", source,
                   ValidUtf8(a), ValidUtf8(b));
    }
    // Its place in the list is its rank; a repeated merge takes its last place, as Hugging Face's
    // map of merges does.
    model.ranks_[PairKey(a, b)] = rank++;
  }
  model.vocab_ = std::move(vocab);
  return model;
}

Status BpeModel::Encode(std::string_view word, std::vector<int32_t>* ids) const {
  if (word.empty()) return OkStatus();
  if (options_.ignore_merges) {
    if (auto it = vocab_.find(std::string(word)); it != vocab_.end()) {
      ids->push_back(it->second);
      return OkStatus();
    }
  }
  std::vector<std::string> symbols;
  for (size_t i = 0; i < word.size();) {
    size_t length = Utf8SequenceLength(word.substr(i));
    if (length == 0) length = 1;  // not reached with valid input; keeps the loop finite
    std::string character(word.substr(i, length));
    i += length;
    if (options_.byte_fallback && vocab_.find(character) == vocab_.end()) {
      for (char byte : character) symbols.push_back(fmt::format("<0x{:02X}>", static_cast<uint8_t>(byte)));
      continue;
    }
    symbols.push_back(std::move(character));
  }
  // Hugging Face's merge: the pair with the best rank anywhere in the word first (the leftmost of
  // equals), one at a time, from a heap of candidate pairs — O(n log n) in the word's length, where
  // rescanning the word for each merge would be quadratic (a prompt in the SentencePiece style is
  // one word). Symbols merged away are marked empty; stale heap entries are skipped.
  struct Candidate {
    uint32_t rank;
    size_t position;
    bool operator>(const Candidate& other) const {
      return rank != other.rank ? rank > other.rank : position > other.position;
    }
  };
  const size_t n = symbols.size();
  std::vector<size_t> next(n), previous(n);
  for (size_t i = 0; i < n; ++i) {
    next[i] = i + 1;  // n: none
    previous[i] = i == 0 ? n : i - 1;
  }
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto consider = [&](size_t left) {
    if (left >= n || next[left] >= n) return;
    auto it = ranks_.find(PairKey(symbols[left], symbols[next[left]]));
    if (it != ranks_.end()) heap.push({it->second, left});
  };
  for (size_t i = 0; i + 1 < n; ++i) consider(i);
  while (!heap.empty()) {
    const Candidate top = heap.top();
    heap.pop();
    const size_t left = top.position;
    if (symbols[left].empty() || next[left] >= n) continue;
    const size_t right = next[left];
    auto it = ranks_.find(PairKey(symbols[left], symbols[right]));
    if (it == ranks_.end() || it->second != top.rank) continue;  // the pair changed since
    symbols[left] += symbols[right];
    symbols[right].clear();
    next[left] = next[right];
    if (next[left] < n) previous[next[left]] = left;
    if (previous[left] < n) consider(previous[left]);
    consider(left);
  }
  std::vector<std::string> merged;
  for (size_t i = 0; i < n; i = next[i]) merged.push_back(std::move(symbols[i]));
  symbols = std::move(merged);
  bool last_was_unk = false;
  for (const std::string& symbol : symbols) {
    auto it = vocab_.find(symbol);
    if (it != vocab_.end()) {
      ids->push_back(it->second);
      last_was_unk = false;
      continue;
    }
    if (!options_.unk) {
      return Error(Code::kInvalidArgument, "symbol \"{}\" is not in the vocabulary", ValidUtf8(symbol));
    }
    if (!(options_.fuse_unk && last_was_unk)) ids->push_back(vocab_.at(*options_.unk));
    last_was_unk = true;
  }
  return OkStatus();
}

}  // namespace warmpool::tokenizer
