#include "engines/tokenizer/tokenizer.h"

#include <cerrno>
#include <cstring>

#include <nlohmann/json.hpp>

#include "common/small_file.h"
#include "common/utf8.h"
#include "engines/json_describe.h"
#include "engines/tokenizer/byte_level.h"
#include "engines/tokenizer/json_fields.h"
#include "engines/tokenizer/metaspace.h"
#include "engines/tokenizer/normalizer.h"

namespace warmpool::tokenizer {
namespace {

using Json = nlohmann::json;

constexpr uint64_t kMaxTokenizerBytes = 256u << 20;
constexpr int64_t kMaxVocab = 1 << 24;
constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// The pattern the pre-tokenizer splits by: GPT-2's for a ByteLevel one that uses its own, or a
// Split's followed by a ByteLevel that does not.
Result<std::string> PatternOf(const Json& pre, std::string_view source) {
  auto byte_level = [&](const Json& b, bool* uses_regex) -> Status {
    if (FlagOf(b, "add_prefix_space", false)) {
      return Error(Code::kInvalidArgument, "{}: ByteLevel add_prefix_space is not supported", source);
    }
    *uses_regex = FlagOf(b, "use_regex", true);
    return OkStatus();
  };
  const std::string type = TypeOf(pre);
  if (type == "ByteLevel") {
    bool uses_regex = true;
    if (Status s = byte_level(pre, &uses_regex); !s.ok()) return s;
    if (!uses_regex) return Error(Code::kInvalidArgument, "{}: a ByteLevel pre-tokenizer without a regex", source);
    return std::string(kGpt2Pattern);
  }
  if (type == "Sequence") {
    const Json& steps = FieldOf(pre, "pretokenizers");
    if (steps.size() == 2 && TypeOf(steps[0]) == "Split" && TypeOf(steps[1]) == "ByteLevel") {
      const Json& split = steps[0];
      bool uses_regex = true;
      if (Status s = byte_level(steps[1], &uses_regex); !s.ok()) return s;
      const Json& pattern = FieldOf(split, "pattern");
      if (!pattern.is_object() || !pattern.contains("Regex") || !pattern["Regex"].is_string()) {
        return Error(Code::kInvalidArgument, "{}: the Split pre-tokenizer has no \"Regex\" pattern", source);
      }
      if (split.value("behavior", "") != "Isolated" || FlagOf(split, "invert", false) || uses_regex) {
        return Error(Code::kInvalidArgument,
                     "{}: only a Split with behavior Isolated, not inverted, then ByteLevel without its own regex "
                     "is supported",
                     source);
      }
      return pattern["Regex"].get<std::string>();
    }
  }
  return Error(Code::kInvalidArgument,
               "{}: pre-tokenizer {} is not supported (supported: ByteLevel, or Split then ByteLevel)", source,
               DescribeJson(pre));
}

size_t IncompleteTail(std::string_view bytes) {
  // The bytes at the end that could still become a character with more to come.
  for (size_t back = 1; back <= 3 && back <= bytes.size(); ++back) {
    const auto lead = static_cast<uint8_t>(bytes[bytes.size() - back]);
    if ((lead & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    const size_t need = lead >= 0xF0 && lead <= 0xF4 ? 4 : lead >= 0xE0 && lead <= 0xEF ? 3 : lead >= 0xC2 && lead <= 0xDF ? 2 : 0;
    return need > back ? back : 0;
  }
  return 0;
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> Tokenizer::Load(const std::string& path) {
  Result<std::string> text = ReadSmallFile(path, kMaxTokenizerBytes);
  if (!text.ok()) return ValidUtf8(text.status());
  return Parse(*text, path);
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::Parse(std::string_view json_text, std::string_view source) {
  Result<std::unique_ptr<Tokenizer>> parsed = ParseJson(json_text, source);
  if (!parsed.ok()) return ValidUtf8(parsed.status());
  return parsed;
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::ParseJson(std::string_view json_text, std::string_view source) {
  Json json;
  try {
    json = Json::parse(json_text);
  } catch (const Json::exception& e) {
    return Error(Code::kInvalidArgument, "{}: not JSON: {}", source, e.what());
  }
  if (!json.is_object() || !json.contains("model") || !json["model"].is_object()) {
    return Error(Code::kInvalidArgument, "{}: no \"model\" object", source);
  }
  std::unique_ptr<Tokenizer> t(new Tokenizer());
  try {
    const Json& model = json["model"];
    if (const std::string type = TypeOf(model); !type.empty() && type != "BPE") {
      return Error(Code::kInvalidArgument, "{}: model type \"{}\" is not supported (supported: BPE)", source, type);
    }
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      if (model.contains(key) && !model[key].is_null() && model[key] != "") {
        return Error(Code::kInvalidArgument, "{}: BPE {} is not supported", source, key);
      }
    }
    // SentencePiece style (byte fallback, '▁' for spaces) or byte-level: which one the file is
    // decides how everything else in it is read.
    const bool byte_fallback = FlagOf(model, "byte_fallback", false);
    if (byte_fallback || TypeOf(FieldOf(json, "pre_tokenizer")) == "Metaspace") {
      Result<Metaspace> metaspace = ParseMetaspace(json, source);
      if (!metaspace.ok()) return metaspace.status();
      t->metaspace_ = *metaspace;
    } else {
      if (const Json& n = FieldOf(json, "normalizer"); !n.is_null()) {
        if (TypeOf(n) != "NFC") {
          return Error(Code::kInvalidArgument, "{}: normalizer \"{}\" is not supported yet (supported: NFC)", source,
                       TypeOf(n));
        }
        t->nfc_ = true;
      }
      if (const std::string d = TypeOf(FieldOf(json, "decoder")); d != "ByteLevel") {
        return Error(Code::kInvalidArgument, "{}: decoder \"{}\" is not supported (supported: ByteLevel)", source, d);
      }
      Result<std::string> pattern = PatternOf(FieldOf(json, "pre_tokenizer"), source);
      if (!pattern.ok()) return pattern.status();
      Result<RegexSplitter> splitter = RegexSplitter::Compile(*pattern, source);
      if (!splitter.ok()) return splitter.status();
      t->splitter_.emplace(std::move(*splitter));
    }

    std::unordered_map<std::string, int32_t> vocab;
    int64_t highest = -1;
    for (const auto& [symbol, id] : model.at("vocab").items()) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= kMaxVocab) {
        return Error(Code::kInvalidArgument, "{}: vocabulary entry \"{}\" has id {}", source, ValidUtf8(symbol), DescribeJson(id));
      }
      highest = std::max(highest, id.get<int64_t>());
      vocab.emplace(symbol, id.get<int32_t>());
    }
    std::vector<std::pair<std::string, std::string>> merges;
    for (const Json& m : FieldOf(model, "merges")) {
      if (m.is_string()) {
        const std::string text = m.get<std::string>();
        const size_t space = text.find(' ');
        if (space == std::string::npos || text.find(' ', space + 1) != std::string::npos) {
          return Error(Code::kInvalidArgument, "{}: merge \"{}\" is not two symbols", source, ValidUtf8(text));
        }
        merges.emplace_back(text.substr(0, space), text.substr(space + 1));
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
      } else {
        return Error(Code::kInvalidArgument, "{}: merge {} is not two symbols", source, DescribeJson(m));
      }
    }
    for (const Json& a : FieldOf(json, "added_tokens")) {
      const int64_t id = a.at("id").get<int64_t>();
      AddedToken token{static_cast<int32_t>(id),      a.at("content").get<std::string>(),
                       FlagOf(a, "special", false),  FlagOf(a, "single_word", false),
                       FlagOf(a, "lstrip", false),   FlagOf(a, "rstrip", false)};
      if (id < 0 || id >= kMaxVocab || token.content.empty()) {
        return Error(Code::kInvalidArgument, "{}: added token {} has id {}", source, ValidUtf8(token.content), id);
      }
      if (!IsValidUtf8(token.content)) {
        return Error(Code::kInvalidArgument, "{}: added token {} is not valid UTF-8", source, ValidUtf8(token.content));
      }
      highest = std::max<int64_t>(highest, token.id);
      t->added_ids_[token.content] = token.id;
      t->added_.Add(std::move(token));
    }
    // Ids index a table: a file whose ids run far past its entries would make a huge one.
    const int64_t entries = static_cast<int64_t>(vocab.size() + t->added_.all().size());
    if (highest >= 2 * entries + 1024) {
      return Error(Code::kInvalidArgument, "{}: token ids run to {} for {} tokens", source, highest, entries);
    }
    t->pieces_.assign(static_cast<size_t>(highest + 1), std::string());
    t->special_.assign(t->pieces_.size(), false);
    for (const auto& [symbol, id] : vocab) {
      Result<std::string> bytes = t->PieceOf(symbol, byte_fallback);
      if (!bytes.ok()) return Error(Code::kInvalidArgument, "{}: {}", source, bytes.status().message());
      t->pieces_[static_cast<size_t>(id)] = std::move(*bytes);
    }
    if (!t->metaspace_) {
      for (int b = 0; b < 256; ++b) {
        if (vocab.find(ByteSymbol(static_cast<uint8_t>(b))) == vocab.end()) {
          return Error(Code::kInvalidArgument, "{}: the vocabulary lacks the symbol of byte {}: not a byte-level BPE",
                       source, b);
        }
      }
    }
    for (const AddedToken& a : t->added_.all()) {
      t->pieces_[static_cast<size_t>(a.id)] = a.content;
      t->special_[static_cast<size_t>(a.id)] = a.special;
    }
    Result<PostProcessor> post = ParsePostProcessor(FieldOf(json, "post_processor"), source);
    if (!post.ok()) return post.status();
    for (const std::vector<int32_t>* ids : {&post->before, &post->after}) {
      for (int32_t id : *ids) {
        if (static_cast<size_t>(id) >= t->pieces_.size()) {
          return Error(Code::kInvalidArgument, "{}: the post-processor adds token {}, which is not in the vocabulary",
                       source, id);
        }
      }
    }
    t->post_processor_ = *post;
    BpeModel::Options options;
    options.ignore_merges = FlagOf(model, "ignore_merges", false);
    options.byte_fallback = byte_fallback;
    options.fuse_unk = FlagOf(model, "fuse_unk", false);
    if (model.contains("unk_token") && model["unk_token"].is_string()) options.unk = model["unk_token"].get<std::string>();
    Result<BpeModel> bpe = BpeModel::Make(std::move(vocab), merges, options, source);
    if (!bpe.ok()) return bpe.status();
    t->bpe_.emplace(std::move(*bpe));
  } catch (const Json::exception& e) {
    return Error(Code::kInvalidArgument, "{}: malformed: {}", source, e.what());
  }
  return t;
}

Result<std::string> Tokenizer::PieceOf(const std::string& symbol, bool byte_fallback) const {
  if (!metaspace_) {
    std::optional<std::string> bytes = FromSymbols(symbol);
    if (!bytes) return Error(Code::kInvalidArgument, "vocabulary entry \"{}\" is not made of byte-level symbols", symbol);
    return *bytes;
  }
  // "<0x41>": the byte a byte-fallback token stands for.
  if (byte_fallback && symbol.size() == 6 && symbol.starts_with("<0x") && symbol.ends_with(">")) {
    const std::string hex = symbol.substr(3, 2);
    if (hex.find_first_not_of("0123456789ABCDEF") == std::string::npos) {
      return std::string(1, static_cast<char>(std::stoi(hex, nullptr, 16)));
    }
  }
  std::string text;
  for (size_t at = 0;;) {
    const size_t next = symbol.find(kMetaspace, at);
    text.append(symbol, at, next == std::string::npos ? std::string::npos : next - at);
    if (next == std::string::npos) break;
    text += ' ';
    at = next + kMetaspace.size();
  }
  return text;
}

std::optional<int32_t> Tokenizer::TokenId(std::string_view content) const {
  if (auto it = added_ids_.find(std::string(content)); it != added_ids_.end()) return it->second;
  const std::string symbol = metaspace_ ? std::string(content) : ToSymbols(content);
  if (auto it = bpe_->vocab().find(symbol); it != bpe_->vocab().end()) return it->second;
  return std::nullopt;
}

Status Tokenizer::EncodeText(std::string_view text, bool at_start, std::vector<int32_t>* ids) const {
  if (metaspace_) {
    std::vector<std::string> words;
    metaspace_->Pieces(text, at_start, &words);
    for (const std::string& word : words) {
      if (Status s = bpe_->Encode(word, ids); !s.ok()) return s;
    }
    return OkStatus();
  }
  std::string normalized;
  if (nfc_) {
    Result<std::string> nfc = NormalizeNfc(text);
    if (!nfc.ok()) return nfc.status();
    normalized = std::move(*nfc);
    text = normalized;
  }
  std::vector<std::string_view> pieces;
  if (Status s = splitter_->Split(text, &pieces); !s.ok()) return s;
  for (std::string_view piece : pieces) {
    if (Status s = bpe_->Encode(ToSymbols(piece), ids); !s.ok()) return s;
  }
  return OkStatus();
}

Result<std::vector<int32_t>> Tokenizer::Encode(std::string_view text, bool add_special_tokens) const {
  for (size_t i = 0; i < text.size();) {
    const size_t length = Utf8SequenceLength(text.substr(i));
    if (length == 0) return Error(Code::kInvalidArgument, "the text is not valid UTF-8 at byte {}", i);
    i += length;
  }
  std::vector<int32_t> ids;
  if (add_special_tokens) ids = post_processor_.before;
  size_t plain = 0;  // start of the text not yet encoded
  while (std::optional<AddedMatch> match = added_.Next(text, plain, plain)) {
    if (Status s = EncodeText(text.substr(plain, match->start - plain), plain == 0, &ids); !s.ok()) return s;
    ids.push_back(match->token->id);
    plain = match->end;
  }
  if (Status s = EncodeText(text.substr(plain), plain == 0, &ids); !s.ok()) return s;
  if (add_special_tokens) ids.insert(ids.end(), post_processor_.after.begin(), post_processor_.after.end());
  return ids;
}

Result<std::string> Tokenizer::Decode(std::span<const int32_t> ids, bool skip_special) const {
  Result<std::string> out = DecodePieces(ids, skip_special);
  if (out.ok() && strips_leading_space() && out->starts_with(' ')) out->erase(0, 1);
  return out;
}

Result<std::string> Tokenizer::DecodePieces(std::span<const int32_t> ids, bool skip_special) const {
  std::string out;
  for (int32_t id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= pieces_.size()) {
      return Error(Code::kInvalidArgument, "token {} is outside the vocabulary of {}", id, pieces_.size());
    }
    if (skip_special && special_[static_cast<size_t>(id)]) continue;
    out += pieces_[static_cast<size_t>(id)];
  }
  return out;
}

Result<std::string> StreamingDecoder::Push(int32_t id) {
  Result<std::string> bytes = tokenizer_.DecodePieces({&id, 1}, skip_special_);
  if (!bytes.ok()) return bytes.status();
  // The space a SentencePiece-style prefix put before the text goes, once, as Decode drops it.
  if (!started_ && !bytes->empty()) {
    started_ = true;
    if (tokenizer_.strips_leading_space() && bytes->starts_with(' ')) bytes->erase(0, 1);
  }
  pending_ += *bytes;
  std::string out;
  const size_t ready = pending_.size() - IncompleteTail(pending_);
  for (size_t i = 0; i < ready;) {
    const size_t length = Utf8SequenceLength(std::string_view(pending_).substr(i, ready - i));
    if (length == 0) {
      out += kReplacement;  // a byte no character can be made of
      ++i;
    } else {
      out.append(pending_, i, length);
      i += length;
    }
  }
  pending_.erase(0, ready);
  return out;
}

std::string StreamingDecoder::Finish() {
  std::string out;
  for (size_t i = 0; i < pending_.size(); ++i) out += kReplacement;
  pending_.clear();
  return out;
}

}  // namespace warmpool::tokenizer
