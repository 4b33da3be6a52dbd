#include "engines/tokenizer/bpe.h"

#include <limits>

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
  for (const auto& [a, b] : merges) {
    if (a.empty() || b.empty()) return Error(Code::kInvalidArgument, "{}: a merge has an empty half", source);
    if (vocab.find(a + b) == vocab.end()) {
      return Error(Code::kInvalidArgument, "{}: the merge of \"{}\" and \"{}\" makes a symbol the vocabulary lacks",
                   source, ValidUtf8(a), ValidUtf8(b));
    }
    // A repeated merge keeps its first (best) rank, as a list read in order would.
    model.ranks_.emplace(PairKey(a, b), static_cast<uint32_t>(model.ranks_.size()));
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
  while (symbols.size() > 1) {
    uint32_t best = std::numeric_limits<uint32_t>::max();
    std::string_view first, second;
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      auto it = ranks_.find(PairKey(symbols[i], symbols[i + 1]));
      if (it != ranks_.end() && it->second < best) {
        best = it->second;
        first = symbols[i];
        second = symbols[i + 1];
      }
    }
    if (best == std::numeric_limits<uint32_t>::max()) break;
    const std::string a(first), b(second);
    std::vector<std::string> merged;
    merged.reserve(symbols.size());
    for (size_t i = 0; i < symbols.size(); ++i) {
      if (i + 1 < symbols.size() && symbols[i] == a && symbols[i + 1] == b) {
        merged.push_back(a + b);
        ++i;
      } else {
        merged.push_back(std::move(symbols[i]));
      }
    }
    symbols = std::move(merged);
  }
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
