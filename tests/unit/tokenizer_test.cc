// BPE tokenizers, byte-level and SentencePiece-style, against tests/python/tokenizer_reference.py (written from GPT-2's and
// Hugging Face's definitions, with the `regex` module): vocabularies trained by the reference on a
// text Debian ships, then the same texts encoded by both — corpus lines, hostile strings and
// random UTF-8 — and decoded back, at once and as a stream.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/utf8.h"
#include "engines/tokenizer/normalizer.h"
#include "engines/tokenizer/tokenizer.h"
#include "tests/text.h"
#include "tests/unit/temp_dir.h"

namespace warmpool::tokenizer {
namespace {

using Json = nlohmann::json;
using warmpool::testing::Contains;
using warmpool::testing::TempDir;

constexpr char kCorpus[] = "/usr/share/common-licenses/GPL-3";  // base-files: on every Debian system

std::string RunReference(const std::string& arguments) {
  const std::string command = fmt::format("{} {}/tests/python/tokenizer_reference.py {}", WARMPOOL_PYTHON3,
                                          WARMPOOL_SOURCE_DIR, arguments);
  FILE* pipe = popen(command.c_str(), "r");
  std::string out;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof(buffer), pipe)) out.append(buffer, n);
  EXPECT_EQ(pclose(pipe), 0) << command;
  return out;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// A code point from ranges a tokenizer meets: ASCII, whitespace of every kind, Latin-1, Cyrillic,
// combining marks, CJK, emoji (four bytes), digits of other scripts.
std::string RandomCharacter(std::mt19937_64& g) {
  static const std::vector<std::pair<uint32_t, uint32_t>> ranges = {
      {0x20, 0x7E}, {0x20, 0x7E}, {0x20, 0x7E}, {0x09, 0x0D}, {0xA0, 0xFF}, {0x0400, 0x04FF}, {0x0300, 0x036F},
      {0x4E00, 0x4E80}, {0x1F600, 0x1F64F}, {0x0660, 0x0669}, {0x2000, 0x200B}, {0x3000, 0x3000}, {0x27, 0x27}};
  const auto& [low, high] = ranges[g() % ranges.size()];
  const uint32_t c = low + static_cast<uint32_t>(g() % (high - low + 1));
  std::string out;
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
  return out;
}

std::vector<std::string> Texts() {
  std::vector<std::string> texts = {
      "",
      " ",
      "Hello, world!",
      "  leading and trailing spaces  ",
      "don't won't I'M YOU'RE they'll we'd",
      "1234567890 12 3.14159 1e-9",
      "line one\nline two\r\n\r\n\ttabbed\n\n\n",
      "naïve café Ünïcödé — “quotes” …",
      "Привет, мир! 你好，世界。 مرحبا ١٢٣",
      "e\u0301 combining and 🙂🙃 emoji and 👩‍👩‍👧 a family",
      "<|begin_of_text|>system<|end|>\nYou are helpful.<|end|><|begin_of_text|>",
      "<|begin_of_text|<|end||>",  // near misses of the specials
      "<|end|>>x<|end|> <|end|>>>",  // two specials start alike: the longer wins
      " zebra quokka! zebras Zebra",  // whole words the vocabulary has without merges
      "<s>[INST] Hi there [/INST] Hello!</s>",  // a SentencePiece-style chat
      "a<s>b</s> c<unk>",
      "\u3000ideographic space\u2003em space\u00a0no-break",
      std::string(300, 'a') + std::string(100, ' ') + std::string(50, '!'),
  };
  const std::string corpus = ReadFile(kCorpus);
  std::istringstream lines(corpus);
  std::string line;
  for (int i = 0; i < 150 && std::getline(lines, line); ++i) texts.push_back(line);
  std::mt19937_64 g(7);
  for (int i = 0; i < 300; ++i) {
    std::string text;
    const int length = static_cast<int>(g() % 40);
    for (int c = 0; c < length; ++c) text += RandomCharacter(g);
    texts.push_back(text);
  }
  return texts;
}

class TokenizerReference : public ::testing::TestWithParam<const char*> {};

TEST_P(TokenizerReference, EncodingsEqualTheReferenceAndDecodeBackToTheText) {
  TempDir dir;
  const std::string style = GetParam();
  // A corpus of the license text and some of every script the texts use.
  {
    std::ofstream corpus(dir.File("corpus.txt"), std::ios::binary);
    corpus << ReadFile(kCorpus).substr(0, 20000)
           << "\nПривет мир привет. 你好世界你好。 naïve café café. 1234 5678 don't don't\n";
  }
  const bool ignore_merges = style == "llama3";
  const bool nfc = style == "qwen2-nfc";  // Qwen2's own normalizer
  RunReference(fmt::format("train {} --merges 300 --style {} --out {}{}{}", dir.File("corpus.txt"),
                           nfc ? "qwen2" : style, dir.File("tokenizer.json"), ignore_merges ? " --ignore-merges" : "",
                           nfc ? " --nfc" : ""));
  {
    // Words in the vocabulary that no merge makes, as real vocabularies have: with ignore_merges
    // (Llama 3's) a word that is one of them is that token.
    Json file = Json::parse(ReadFile(dir.File("tokenizer.json")));
    int32_t next = 0;
    for (const auto& [symbol, id] : file["model"]["vocab"].items()) next = std::max(next, id.get<int32_t>() + 1);
    for (const Json& added : file["added_tokens"]) next = std::max(next, added["id"].get<int32_t>() + 1);
    file["model"]["vocab"]["\u0120zebra"] = next;
    file["model"]["vocab"]["quokka"] = next + 1;
    std::ofstream(dir.File("tokenizer.json"), std::ios::trunc) << file.dump();
  }
  Result<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::Load(dir.File("tokenizer.json"));
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();
  const std::vector<int32_t> zebra = *(*tokenizer)->Encode(" zebra");
  EXPECT_EQ(zebra.size() == 1, ignore_merges) << style << ": \" zebra\" is " << zebra.size() << " tokens";

  const std::vector<std::string> texts = Texts();
  std::ofstream(dir.File("texts.json")) << Json(texts).dump();
  const Json want = Json::parse(RunReference(fmt::format("encode {} {}", dir.File("tokenizer.json"), dir.File("texts.json"))));
  ASSERT_EQ(want.size(), texts.size());
  size_t merged_tokens = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    Result<std::vector<int32_t>> ids = (*tokenizer)->Encode(texts[i]);
    ASSERT_TRUE(ids.ok()) << ids.status().ToString();
    ASSERT_EQ(Json(*ids), want[i]) << style << ", text " << i << ": \"" << texts[i] << "\"";
    for (int32_t id : *ids) merged_tokens += id >= 256;

    Result<std::string> decoded = (*tokenizer)->Decode(*ids);
    ASSERT_TRUE(decoded.ok());
    // Llama 2's legacy normalizer puts a '▁' before every run of text, after an added token too:
    // there the space it becomes is decoded, as Hugging Face's tokenizer does.
    bool legacy_space = false;
    for (const AddedToken& added : (*tokenizer)->added_tokens()) {
      legacy_space = legacy_space || (style == "sentencepiece" && Contains(texts[i], added.content));
    }
    // With a Metaspace pre-tokenizer a text that starts with a space gets no '▁' before it, and
    // the decoder still drops one leading space (Hugging Face's does the same).
    const bool drops_space = style == "metaspace" && texts[i].starts_with(' ');
    // With NFC the text comes back normalized ("e" and a combining accent as one "é").
    const std::string given = nfc ? *NormalizeNfc(texts[i]) : texts[i];
    if (!legacy_space) {
      EXPECT_EQ(*decoded, drops_space ? given.substr(1) : given) << style;
    }
    StreamingDecoder stream(**tokenizer, /*skip_special=*/false);
    std::string streamed;
    for (int32_t id : *ids) {
      Result<std::string> part = stream.Push(id);
      ASSERT_TRUE(part.ok());
      EXPECT_EQ(ValidUtf8(*part), *part) << "a stream's piece splits a character";
      streamed += *part;
    }
    streamed += stream.Finish();
    EXPECT_EQ(streamed, *decoded) << style;
  }
  EXPECT_GT(merged_tokens, 1000u) << "the merges are used";
  if (style == "sentencepiece" || style == "metaspace") {
    // Characters the vocabulary lacks (seen once in the corpus, or never) came as their bytes.
    const std::vector<int32_t> rare = *(*tokenizer)->Encode("\U0001F642");
    EXPECT_EQ(rare.size(), 5u) << "'▁' and the emoji's four byte tokens";
  }
}

INSTANTIATE_TEST_SUITE_P(Styles, TokenizerReference,
                         ::testing::Values("gpt2", "llama3", "qwen2", "qwen2-nfc", "sentencepiece", "metaspace"));

class TokenizerFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    std::ofstream(dir_.File("corpus.txt")) << "abc abc abd";
    RunReference(fmt::format("train {} --merges 3 --style llama3 --out {}", dir_.File("corpus.txt"), dir_.File("t.json")));
    base_ = Json::parse(ReadFile(dir_.File("t.json")));
  }
  Status ParseWith(const std::function<void(Json&)>& edit) {
    Json j = base_;
    edit(j);
    Result<std::unique_ptr<Tokenizer>> t = Tokenizer::Parse(j.dump(), "tokenizer.json");
    return t.ok() ? OkStatus() : t.status();
  }
  TempDir dir_;
  Json base_;
};

TEST_F(TokenizerFiles, WhatIsNotDoneHereIsRefusedByName) {
  ASSERT_TRUE(ParseWith([](Json&) {}).ok());
  struct Case {
    std::function<void(Json&)> edit;
    const char* named;
  };
  const Case cases[] = {
      {[](Json& j) { j["model"]["type"] = "WordPiece"; }, "model type \"WordPiece\""},
      {[](Json& j) { j["model"]["byte_fallback"] = true; }, "not supported for a byte-fallback BPE"},
      {[](Json& j) { j["normalizer"] = {{"type", "NFKC"}}; }, "normalizer \"NFKC\""},
      {[](Json& j) { j["decoder"] = {{"type", "Metaspace"}}; }, "decoder \"Metaspace\""},
      {[](Json& j) { j["pre_tokenizer"] = {{"type", "Whitespace"}}; }, "pre-tokenizer"},
      {[](Json& j) { j["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = true; }, "add_prefix_space"},
      {[](Json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed"; }, "does not compile"},
      {[](Json& j) { j["model"]["vocab"].erase("Ġ"); }, "lacks the symbol of byte 32"},
      {[](Json& j) { j["model"]["merges"].push_back(Json::array({"x", "y"})); }, "makes a symbol the vocabulary lacks"},
      {[](Json& j) { j["model"]["merges"].push_back("a b c"); }, "is not two symbols"},
      {[](Json& j) { j["model"]["vocab"]["zz"] = -4; }, "has id -4"},
      {[](Json& j) { j["model"]["vocab"]["\u4e00"] = 400; }, "not made of byte-level symbols"},
      {[](Json& j) { j.erase("model"); }, "no \"model\""},
      {[](Json& j) { j["model"]["vocab"]["zz"] = 16777215; }, "token ids run to 16777215"},
      {[](Json& j) { j["added_tokens"][0]["id"] = 4294967297LL; }, "has id 4294967297"},
      {[](Json& j) {
         j["model"]["byte_fallback"] = true;
         j["normalizer"] = {{"type", "Sequence"}};  // no "normalizers"
         j["pre_tokenizer"] = nullptr;
       },
       "normalizer"},
  };
  for (const Case& c : cases) {
    Status s = ParseWith(c.edit);
    EXPECT_EQ(s.code(), Code::kInvalidArgument) << c.named;
    EXPECT_TRUE(Contains(s.message(), c.named)) << "wanted \"" << c.named << "\" in: " << s.message();
  }
  EXPECT_EQ(Tokenizer::Parse("{", "t").status().code(), Code::kInvalidArgument);
  // Deep nesting where an error would quote the value: described by its kind, not dumped (a dump
  // recurses once per level).
  Json shallow = base_;
  shallow.erase("pre_tokenizer");
  std::string text = shallow.dump();
  text.insert(1, "\"pre_tokenizer\":" + std::string(200000, '[') + std::string(200000, ']') + ",");
  Result<std::unique_ptr<Tokenizer>> refused = Tokenizer::Parse(text, "t");
  EXPECT_EQ(refused.status().code(), Code::kInvalidArgument) << refused.status().ToString().substr(0, 200);
  EXPECT_TRUE(Contains(refused.status().message(), "pre-tokenizer array is not supported"))
      << refused.status().ToString().substr(0, 200);
  EXPECT_EQ(Tokenizer::Load(dir_.File("missing.json")).status().code(), Code::kNotFound);
}

// Added tokens' options as Hugging Face's tokenizers apply them (the reference implements them from
// that definition): whitespace stripped to the left or right of a token, and a single-word token
// that is no match inside a word, in byte-level and SentencePiece-style vocabularies.
TEST(TokenizerAddedTokens, StripsAndSingleWordsEncodeAsTheReferenceDoes) {
  TempDir dir;
  for (const char* style : {"llama3", "sentencepiece"}) {
    RunReference(fmt::format("train {} --merges 200 --style {} --out {}", kCorpus, style, dir.File("t.json")));
    Json file = Json::parse(ReadFile(dir.File("t.json")));
    int32_t next = 0;
    for (const auto& [symbol, id] : file["model"]["vocab"].items()) next = std::max(next, id.get<int32_t>() + 1);
    for (const Json& added : file["added_tokens"]) next = std::max(next, added["id"].get<int32_t>() + 1);
    auto add = [&](const std::string& content, bool lstrip, bool rstrip, bool single_word) {
      file["added_tokens"].push_back({{"id", next++}, {"content", content}, {"single_word", single_word},
                                      {"lstrip", lstrip}, {"rstrip", rstrip}, {"normalized", false},
                                      {"special", true}});
    };
    add("<mask>", true, false, false);
    add("<|assistant|>", false, true, false);
    add("<both>", true, true, false);
    add("cat", false, false, true);
    add("caté", false, false, true);
    std::ofstream(dir.File("t.json"), std::ios::trunc) << file.dump();
    Result<std::unique_ptr<Tokenizer>> t = Tokenizer::Load(dir.File("t.json"));
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    const std::vector<std::string> texts = {
        "I saw a <mask> here",      "I saw a   \t<mask>",        "<mask> first",
        "<|assistant|>   \n hi",    "x<|assistant|>\u3000y",     " <both> \u00a0 z",
        "<mask><mask>  <mask>",     "<|assistant|>  <mask>",      "a <both>  <both> b",
        "the cat sat",              "concatenate cat",            "cat_ cat1 cat. (cat)",
        "caté caté café cat\u0301", "\u4e2dcat\u4e2d cat\u3000", "cats and dogs, cat!",
        "<|end|> cat <|end|>",      "",                           "   ",
    };
    std::ofstream(dir.File("texts.json")) << Json(texts).dump();
    const Json want = Json::parse(RunReference(fmt::format("encode {} {}", dir.File("t.json"), dir.File("texts.json"))));
    ASSERT_EQ(want.size(), texts.size());
    for (size_t i = 0; i < texts.size(); ++i) {
      Result<std::vector<int32_t>> ids = (*t)->Encode(texts[i]);
      ASSERT_TRUE(ids.ok()) << ids.status().ToString();
      EXPECT_EQ(Json(*ids), want[i]) << style << ": \"" << texts[i] << "\"";
    }
    // What the options do, said plainly: the stripped spaces are in no token.
    const int32_t mask = (*t)->TokenId("<mask>").value_or(-1);
    const std::vector<int32_t> a = *(*t)->Encode("a<mask>"), b = *(*t)->Encode("a   <mask>");
    EXPECT_EQ(a, b) << style;
    EXPECT_EQ(a.back(), mask);
  }
}

TEST_F(TokenizerFiles, ThePostProcessorsSpecialTokensComeOnlyWhenAsked) {
  const int32_t bos = base_["added_tokens"][0]["id"].get<int32_t>();  // <|begin_of_text|>
  const int32_t end = base_["added_tokens"][1]["id"].get<int32_t>();  // <|end|>
  const Json llama3 = {
      {"type", "Sequence"},
      {"processors",
       {{{"type", "ByteLevel"}, {"trim_offsets", false}},
        {{"type", "TemplateProcessing"},
         {"single", {{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
                     {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                     {{"SpecialToken", {{"id", "<|end|>"}, {"type_id", 0}}}}}},
         {"special_tokens",
          {{"<|begin_of_text|>", {{"id", "<|begin_of_text|>"}, {"ids", {bos}}, {"tokens", {"<|begin_of_text|>"}}}},
           {"<|end|>", {{"id", "<|end|>"}, {"ids", {end}}, {"tokens", {"<|end|>"}}}}}}}}}};
  Json file = base_;
  file["post_processor"] = llama3;
  Result<std::unique_ptr<Tokenizer>> t = Tokenizer::Parse(file.dump(), "t");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  const std::vector<int32_t> plain = *(*t)->Encode("abc");
  std::vector<int32_t> wrapped = {bos};
  wrapped.insert(wrapped.end(), plain.begin(), plain.end());
  wrapped.push_back(end);
  EXPECT_EQ(*(*t)->Encode("abc", /*add_special_tokens=*/true), wrapped);
  EXPECT_EQ(*(*t)->Encode("", true), std::vector<int32_t>({bos, end}));

  Status roberta = ParseWith([](Json& j) { j["post_processor"] = {{"type", "RobertaProcessing"}}; });
  EXPECT_TRUE(Contains(roberta.message(), "post-processor \"RobertaProcessing\"")) << roberta.message();
  Status unnamed = ParseWith([&](Json& j) {
    j["post_processor"] = llama3;
    j["post_processor"]["processors"][1]["special_tokens"].erase("<|end|>");
  });
  EXPECT_TRUE(Contains(unnamed.message(), "special token \"<|end|>\" without its ids")) << unnamed.message();
  Status outside = ParseWith([&](Json& j) {
    j["post_processor"] = llama3;
    j["post_processor"]["processors"][1]["special_tokens"]["<|end|>"]["ids"] = {999999};
  });
  EXPECT_TRUE(Contains(outside.message(), "adds token 999999")) << outside.message();
}

TEST_F(TokenizerFiles, BadTextAndBadIdsAreRefused) {
  Result<std::unique_ptr<Tokenizer>> t = Tokenizer::Parse(base_.dump(), "t");
  ASSERT_TRUE(t.ok());
  for (std::string bad : {std::string("\xff"), std::string("ab\xc3"), std::string("\xed\xa0\x80"),
                          std::string("\xc0\xaf")}) {
    Result<std::vector<int32_t>> ids = (*t)->Encode(bad);
    EXPECT_EQ(ids.status().code(), Code::kInvalidArgument);
    EXPECT_TRUE(Contains(ids.status().message(), "not valid UTF-8")) << ids.status().message();
  }
  const int32_t outside[] = {(int32_t)(*t)->vocab_size()};
  EXPECT_EQ((*t)->Decode(outside).status().code(), Code::kInvalidArgument);
  const int32_t negative[] = {-1};
  EXPECT_EQ((*t)->Decode(negative).status().code(), Code::kInvalidArgument);
  const std::optional<int32_t> end = (*t)->TokenId("<|end|>");
  ASSERT_TRUE(end.has_value());
  const int32_t with_special[] = {*(*t)->TokenId("a"), *end, *(*t)->TokenId("b")};
  EXPECT_EQ(*(*t)->Decode(with_special), "a<|end|>b");
  EXPECT_EQ(*(*t)->Decode(with_special, /*skip_special=*/true), "ab");
  // A character cut by a stream's end comes out as U+FFFD, never as a split byte.
  StreamingDecoder stream(**t);
  const int32_t first_byte_of_e_acute = *(*t)->TokenId("\xc3");
  EXPECT_EQ(*stream.Push(first_byte_of_e_acute), "");
  EXPECT_EQ(stream.Finish(), "\xEF\xBF\xBD");
}

}  // namespace
}  // namespace warmpool::tokenizer
