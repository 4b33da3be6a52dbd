// A Hugging Face model directory read as one (ModelDirectory): a random checkpoint, a tokenizer
// trained by tests/python/tokenizer_reference.py, tokenizer_config.json and generation_config.json;
// then text in, text out, in-process. Files that disagree with each other are refused by name.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/utf8.h"
#include "engines/transformer/cpu_model.h"
#include "engines/transformer/generation.h"
#include "engines/transformer/model_directory.h"
#include "engines/transformer/random_checkpoint.h"
#include "engines/transformer/weights.h"
#include "tests/text.h"
#include "tests/unit/temp_dir.h"

namespace warmpool::transformer {
namespace {

using Json = nlohmann::json;
using warmpool::testing::Contains;
using warmpool::testing::TempDir;

// A Llama 3 style byte-level tokenizer (about 560 tokens and three special ones) in directory.
void TrainTokenizer(const std::string& directory) {
  const std::string command = fmt::format(
      "{} {}/tests/python/tokenizer_reference.py train /usr/share/common-licenses/GPL-3 --merges 300 --style llama3 "
      "--out {}/tokenizer.json",
      WARMPOOL_PYTHON3, WARMPOOL_SOURCE_DIR, directory);
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
}

class ModelDirectoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TrainTokenizer(dir_.path());
    // The model's vocabulary is the tokenizer's, so that every token a random model chooses decodes
    // (real models pad theirs, and never choose the padding).
    Result<std::unique_ptr<tokenizer::Tokenizer>> t = tokenizer::Tokenizer::Load(dir_.File("tokenizer.json"));
    ASSERT_TRUE(t.ok());
    RandomCheckpoint spec;
    spec.vocab_size = (*t)->vocab_size();
    ASSERT_TRUE(WriteRandomCheckpoint(dir_.path(), spec).ok());
    Reset();
  }
  // The configuration files as SetUp wrote them, and no generation_config.json.
  void Reset() {
    std::remove(dir_.File("generation_config.json").c_str());
    Write("tokenizer_config.json", {{"bos_token", "<|begin_of_text|>"},
                                    {"eos_token", {{"content", "<|end|>"}, {"special", true}}},
                                    {"chat_template", "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}"}});
  }
  void Write(const std::string& name, const Json& json) {
    std::ofstream(dir_.File(name), std::ios::trunc) << json.dump();
  }
  Status Open() {
    Result<ModelDirectory> m = ModelDirectory::Open(dir_.path());
    return m.ok() ? OkStatus() : m.status();
  }
  TempDir dir_;
};

TEST_F(ModelDirectoryTest, ReadsTheSpecialTokensTemplateAndDefaultsThenGeneratesText) {
  Result<ModelDirectory> m = ModelDirectory::Open(dir_.path());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const tokenizer::Tokenizer& t = *m->tokenizer;
  EXPECT_EQ(m->bos, t.TokenId("<|begin_of_text|>"));
  EXPECT_EQ(m->end_tokens, std::vector<int32_t>({*t.TokenId("<|end|>")}));
  EXPECT_TRUE(Contains(m->chat_template, "for m in messages"));
  EXPECT_EQ(m->sampling.temperature, 0.0) << "greedy without a generation_config.json";

  // Text in, text out: the prompt's tokens, a greedy generation, streamed back to text.
  Result<ModelWeights> weights = BindWeights(m->checkpoint->config(), m->checkpoint->tensors(), dir_.path());
  ASSERT_TRUE(weights.ok());
  CpuModel model(m->checkpoint->config(), *weights, 2);
  KvCache cache(m->checkpoint->config(), 128);
  GenerationRequest request;
  request.prompt = *t.Encode("<|begin_of_text|>Everyone is permitted to copy");
  EXPECT_EQ(request.prompt.front(), *m->bos);
  request.max_tokens = 24;
  request.sampling = m->sampling;
  request.end_tokens = m->end_tokens;
  tokenizer::StreamingDecoder stream(t);
  std::string text;
  Result<Generation> generated = Generate(model, cache, request, [&](int32_t token) {
    Result<std::string> piece = stream.Push(token);
    EXPECT_TRUE(piece.ok()) << piece.status().ToString();
    if (!piece.ok()) return false;
    text += *piece;
    return true;
  });
  ASSERT_TRUE(generated.ok()) << generated.status().ToString();
  text += stream.Finish();
  EXPECT_FALSE(generated->tokens.empty());
  EXPECT_EQ(ValidUtf8(text), text);
  Result<std::string> whole = t.Decode(generated->tokens, /*skip_special=*/true);
  ASSERT_TRUE(whole.ok());
  // Random weights may put bytes together that make no character: the stream shows U+FFFD there.
  if (ValidUtf8(*whole) == *whole) {
    EXPECT_EQ(*whole, text) << "the stream gives what decoding all at once gives";
  } else {
    EXPECT_TRUE(Contains(text, "\xEF\xBF\xBD")) << text;
  }
}

// Hugging Face's named templates: "default" for chats, "tool_use" for chats that offer tools (as
// apply_chat_template chooses); the tool-call format is the tool template's.
TEST_F(ModelDirectoryTest, NamedTemplatesServeChatsAndChatsWithTools) {
  const Json named = {{"eos_token", "<|end|>"},
                      {"chat_template", {{{"name", "default"}, {"template", "{% for m in messages %}{{ m.content }}{% endfor %}"}},
                                         {{"name", "tool_use"}, {"template", "{{ tools | length }}<tool_call>"}}}}};
  Write("tokenizer_config.json", named);
  Result<ModelDirectory> m = ModelDirectory::Open(dir_.path());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_TRUE(m->chat && m->chat_tools);
  EXPECT_TRUE(Contains(m->tools_template, "<tool_call>"));
  EXPECT_EQ(ChatTemplateText(named.dump()), "{{ tools | length }}<tool_call>");
  Write("tokenizer_config.json", {{"chat_template", {{{"name", "tool_use"}, {"template", "x"}}}}});
  EXPECT_EQ(Open().code(), Code::kInvalidArgument) << "a tool template alone serves no chat";
  Reset();
  EXPECT_EQ(ChatTemplateText(Json{{"chat_template", "plain"}}.dump()), "plain");
}

TEST_F(ModelDirectoryTest, GenerationConfigGivesTheEndTokensAndSamplingDefaults) {
  Result<ModelDirectory> first = ModelDirectory::Open(dir_.path());
  ASSERT_TRUE(first.ok());
  const int32_t end = *first->tokenizer->TokenId("<|end|>");
  const int32_t end2 = *first->tokenizer->TokenId("<|end|>>");
  Write("generation_config.json",
        {{"eos_token_id", {end, end2}}, {"do_sample", true}, {"temperature", 0.6}, {"top_p", 0.9}, {"top_k", 40}});
  Result<ModelDirectory> m = ModelDirectory::Open(dir_.path());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->end_tokens, std::vector<int32_t>({end, end2}));
  EXPECT_EQ(m->sampling.temperature, 0.6);
  EXPECT_EQ(m->sampling.top_p, 0.9);
  EXPECT_EQ(m->sampling.top_k, 40u);
  Write("generation_config.json", {{"eos_token_id", end}, {"temperature", 0.6}});
  EXPECT_EQ(ModelDirectory::Open(dir_.path())->sampling.temperature, 0.0) << "no do_sample: greedy";
  // Sampling with no top_k in the file: generate()'s own default, 50 (Llama 3 Instruct's file is so).
  Write("generation_config.json", {{"eos_token_id", end}, {"do_sample", true}, {"temperature", 0.6}, {"top_p", 0.9}});
  EXPECT_EQ(ModelDirectory::Open(dir_.path())->sampling.top_k, 50u);
}

TEST_F(ModelDirectoryTest, FilesThatDisagreeAreRefusedByName) {
  struct Case {
    std::function<void()> change;
    const char* named;
  };
  const Case cases[] = {
      {[&] { Write("generation_config.json", {{"eos_token_id", 5000}}); }, "eos_token_id 5000 is not a token"},
      {[&] { Write("generation_config.json", {{"eos_token_id", 3}, {"do_sample", true}, {"temperature", -1}}); },
       "generation_config.json\": temperature -1"},
      {[&] { Write("generation_config.json", {{"eos_token_id", 3}, {"do_sample", "yes"}}); }, "wrong type"},
      {[&] { Write("tokenizer_config.json", {{"eos_token", "<|nope|>"}}); }, "eos_token \"<|nope|>\" is not a token"},
      {[&] { Write("tokenizer_config.json", Json::object()); }, "no end token"},
      {[&] { Write("tokenizer_config.json", {{"eos_token", "<|end|>"}, {"chat_template", 7}}); }, "chat_template"},
      {[&] { std::ofstream(dir_.File("tokenizer_config.json"), std::ios::trunc) << "{"; }, "not JSON"},
      {[&] { std::remove(dir_.File("tokenizer.json").c_str()); }, "tokenizer.json"},
  };
  for (const Case& c : cases) {
    Reset();  // valid again; the tokenizer's removal comes last
    c.change();
    Status s = Open();
    EXPECT_FALSE(s.ok()) << c.named;
    EXPECT_TRUE(Contains(s.message(), c.named)) << "wanted \"" << c.named << "\" in: " << s.ToString();
  }
  // A tokenizer with more tokens than the model's vocabulary.
  TempDir small;
  TrainTokenizer(small.path());
  RandomCheckpoint spec;
  spec.vocab_size = 300;
  ASSERT_TRUE(WriteRandomCheckpoint(small.path(), spec).ok());
  Status s = ModelDirectory::Open(small.path()).status();
  EXPECT_TRUE(Contains(s.message(), "past the model's vocabulary of 300")) << s.ToString();
}

// A sentence-transformers directory (modules.json): served when its modules are what warmpool
// computes (the Transformer, a last-token Pooling, Normalize), refused by name when they ask for
// another pooling or a module it does not compute, or are not as sentence-transformers writes them.
TEST_F(ModelDirectoryTest, SentenceTransformersModulesServeOnlyTheLastTokensPooling) {
  const Json transformer = {{"idx", 0}, {"name", "0"}, {"path", ""}, {"type", "sentence_transformers.models.Transformer"}};
  const Json pooling = {{"idx", 1}, {"name", "1"}, {"path", "1_Pooling"}, {"type", "sentence_transformers.models.Pooling"}};
  const Json normalize = {{"idx", 2}, {"name", "2"}, {"path", "2_Normalize"}, {"type", "sentence_transformers.models.Normalize"}};
  std::filesystem::create_directories(dir_.File("1_Pooling"));
  auto pool = [&](const char* mode) {
    Json config = {{"word_embedding_dimension", 64}, {"pooling_mode_cls_token", false},
                   {"pooling_mode_mean_tokens", false}, {"pooling_mode_max_tokens", false},
                   {"pooling_mode_mean_sqrt_len_tokens", false}, {"pooling_mode_weightedmean_tokens", false},
                   {"pooling_mode_lasttoken", false}, {"include_prompt", true}};
    config[mode] = true;
    std::ofstream(dir_.File("1_Pooling/config.json"), std::ios::trunc) << config.dump();
  };
  Write("modules.json", Json::array({transformer, pooling, normalize}));
  pool("pooling_mode_lasttoken");
  EXPECT_TRUE(Open().ok()) << Open().ToString();
  struct Case {
    std::function<void()> change;
    const char* named;
    Code code = Code::kInvalidArgument;
  };
  Json dense = {{"idx", 2}, {"name", "2"}, {"path", "2_Dense"}, {"type", "sentence_transformers.models.Dense"}};
  Json outside = pooling;
  outside["path"] = "../1_Pooling";
  const Case cases[] = {
      {[&] { pool("pooling_mode_mean_tokens"); }, "pooling_mode_mean_tokens is true"},
      {[&] { pool("pooling_mode_cls_token"); }, "pooling_mode_cls_token is true"},
      {[&] { std::ofstream(dir_.File("1_Pooling/config.json"), std::ios::trunc) << "{}"; },
       "pooling_mode_lasttoken is not true"},
      {[&] { std::remove(dir_.File("1_Pooling/config.json").c_str()); }, "1_Pooling/config.json", Code::kNotFound},
      {[&] { Write("modules.json", Json::array({transformer, pooling, dense})); }, "sentence_transformers.models.Dense"},
      {[&] { Write("modules.json", Json::array({transformer, outside})); }, "is not a folder of the directory"},
      {[&] { Write("modules.json", Json::object()); }, "not a JSON array"},
      {[&] { Write("modules.json", Json::array({{{"idx", 0}}})); }, "module 0 has no \"type\""},
      {[&] { std::ofstream(dir_.File("modules.json"), std::ios::trunc) << "[{"; }, "modules.json\": not JSON"},
  };
  for (const Case& c : cases) {
    Write("modules.json", Json::array({transformer, pooling, normalize}));
    pool("pooling_mode_lasttoken");
    c.change();
    Status s = Open();
    EXPECT_FALSE(s.ok()) << c.named;
    EXPECT_TRUE(Contains(s.message(), c.named)) << "wanted \"" << c.named << "\" in: " << s.ToString();
    EXPECT_EQ(s.code(), c.code) << s.ToString();
  }
  // sentence-transformers since 5.4: the modules' types by their new paths, one "pooling_mode".
  Json modern = Json::array(
      {{{"idx", 0}, {"name", "0"}, {"path", ""}, {"type", "sentence_transformers.base.modules.transformer.Transformer"}},
       {{"idx", 1}, {"name", "1"}, {"path", "1_Pooling/"},
        {"type", "sentence_transformers.sentence_transformer.modules.pooling.Pooling"}},
       {{"idx", 2}, {"name", "2"}, {"path", "2_Normalize"}, {"type", "sentence_transformers.base.modules.normalize.Normalize"}}});
  Write("modules.json", modern);
  for (const Json& mode : {Json("lasttoken"), Json::array({"lasttoken"})}) {
    std::ofstream(dir_.File("1_Pooling/config.json"), std::ios::trunc)
        << Json({{"embedding_dimension", 64}, {"pooling_mode", mode}, {"include_prompt", true}}).dump();
    EXPECT_TRUE(Open().ok()) << mode.dump() << ": " << Open().ToString();
  }
  for (const Json& mode : {Json("mean"), Json::array({"lasttoken", "mean"})}) {
    std::ofstream(dir_.File("1_Pooling/config.json"), std::ios::trunc) << Json({{"pooling_mode", mode}}).dump();
    EXPECT_TRUE(Contains(Open().message(), "pooling_mode is")) << mode.dump() << ": " << Open().ToString();
  }
  // A flag Python takes as true is on, whatever its JSON type; no Pooling module pools nothing.
  Write("modules.json", Json::array({transformer, pooling}));
  std::ofstream(dir_.File("1_Pooling/config.json"), std::ios::trunc)
      << Json({{"pooling_mode_lasttoken", 1}, {"pooling_mode_mean_tokens", 1}}).dump();
  EXPECT_TRUE(Contains(Open().message(), "pooling_mode_mean_tokens is 1")) << Open().ToString();
  std::ofstream(dir_.File("1_Pooling/config.json"), std::ios::trunc)
      << Json({{"pooling_mode_lasttoken", 1}, {"pooling_mode_mean_tokens", 0}}).dump();
  EXPECT_TRUE(Open().ok()) << Open().ToString();
  Write("modules.json", Json::array({transformer, normalize}));
  EXPECT_TRUE(Contains(Open().message(), "no Pooling module")) << Open().ToString();
  // A symlink in place of the module's folder is not followed.
  Write("modules.json", Json::array({transformer, pooling}));
  std::filesystem::rename(dir_.File("1_Pooling"), dir_.File("pooling_elsewhere"));
  std::filesystem::create_directory_symlink(dir_.File("pooling_elsewhere"), dir_.File("1_Pooling"));
  Status linked = Open();
  EXPECT_TRUE(Contains(linked.message(), "a symlink is not followed")) << linked.ToString();
  std::filesystem::remove(dir_.File("1_Pooling"));
  std::filesystem::remove(dir_.File("modules.json"));
  EXPECT_TRUE(Open().ok()) << "no modules.json: a plain Hugging Face directory";
}

}  // namespace
}  // namespace warmpool::transformer
