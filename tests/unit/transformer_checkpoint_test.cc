// A checkpoint the transformer engine cannot compute as its config says is refused when it is
// opened, with a typed error naming the key or tensor; and bad requests to a loaded model are
// refused without computing anything.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "engines/transformer/checkpoint.h"
#include "engines/transformer/cpu_model.h"
#include "engines/transformer/embedding.h"
#include "engines/transformer/random_checkpoint.h"
#include "engines/transformer/weights.h"
#include "tests/text.h"
#include "tests/unit/temp_dir.h"

namespace warmpool::transformer {
namespace {

using warmpool::testing::Contains;
using warmpool::testing::TempDir;
using Json = nlohmann::json;

Json BaseConfig() { return Json::parse(ConfigJson(RandomCheckpoint{})); }

Status Parse(const Json& json) {
  Result<Config> config = Config::Parse(json.dump(), "config.json");
  return config.ok() ? OkStatus() : config.status();
}

TEST(TransformerConfig, EachArchitectureParsesWithItsOwnDifferences) {
  for (Architecture a : {Architecture::kLlama, Architecture::kMistral, Architecture::kQwen2, Architecture::kQwen3}) {
    RandomCheckpoint spec;
    spec.architecture = a;
    Result<Config> c = Config::Parse(ConfigJson(spec), "config.json");
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    EXPECT_EQ(c->architecture, a);
    EXPECT_EQ(c->attention_bias, a == Architecture::kQwen2);  // Qwen2's q, k, v always have one
    EXPECT_FALSE(c->output_bias);
    EXPECT_EQ(c->qk_norm, a == Architecture::kQwen3);
    EXPECT_EQ(c->head_dim, 16u);
    EXPECT_EQ(c->KvBytesPerToken(), 2u * 2 * 32 * 4);  // layers x (key + value) x kv heads x head_dim x f32
  }
}

TEST(TransformerConfig, WhatIsNotComputedHereIsRefusedByName) {
  struct Change {
    const char* key;
    Json value;
    Code code;
    const char* named;
  };
  const Change changes[] = {
      {"model_type", "gpt2", Code::kInvalidArgument, "model_type \"gpt2\""},
      {"hidden_act", "gelu", Code::kInvalidArgument, "hidden_act \"gelu\""},
      {"rope_scaling", Json{{"rope_type", "yarn"}, {"factor", 4}}, Code::kInvalidArgument, "\"yarn\""},
      {"rope_scaling", Json{{"rope_type", "llama3"}, {"factor", 8}}, Code::kInvalidArgument, "low_freq_factor"},
      {"num_key_value_heads", 3, Code::kInvalidArgument, "not a multiple of num_key_value_heads 3"},
      {"head_dim", 15, Code::kInvalidArgument, "head_dim 15 is odd"},
      {"num_attention_heads", 3, Code::kInvalidArgument, "hidden_size 64 is not a multiple of num_attention_heads 3"},
      {"hidden_size", Json(), Code::kInvalidArgument, "\"hidden_size\" is missing"},
      {"vocab_size", -1, Code::kInvalidArgument, "\"vocab_size\" is -1"},
      {"vocab_size", 1.5, Code::kInvalidArgument, "\"vocab_size\" is 1.5"},
      {"num_hidden_layers", 1u << 30, Code::kInvalidArgument, "num_hidden_layers"},
      {"rms_norm_eps", -1, Code::kInvalidArgument, "rms_norm_eps"},
      {"rope_theta", "big", Code::kInvalidArgument, "rope_theta"},
      {"partial_rotary_factor", 0.5, Code::kInvalidArgument, "partial_rotary_factor"},
      {"mlp_bias", true, Code::kInvalidArgument, "mlp_bias"},
      {"tie_word_embeddings", "yes", Code::kInvalidArgument, "tie_word_embeddings"},
      // Heads x head size past 2^32 would wrap the buffer sizes of the forward pass.
      {"head_dim", 1 << 20, Code::kInvalidArgument, "num_attention_heads 4 x head_dim 1048576 is more than"},
  };
  for (const Change& change : changes) {
    Json json = BaseConfig();
    if (change.value.is_null()) json.erase(change.key);
    else json[change.key] = change.value;
    Status s = Parse(json);
    EXPECT_EQ(s.code(), change.code) << change.key << ": " << s.ToString();
    EXPECT_TRUE(Contains(s.message(), change.named)) << s.message();
  }
  Json qwen = BaseConfig();
  qwen["model_type"] = "qwen2";
  qwen["use_sliding_window"] = true;
  EXPECT_EQ(Parse(qwen).code(), Code::kInvalidArgument);
  EXPECT_EQ(Config::Parse("{", "config.json").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(Config::Parse("[]", "config.json").status().code(), Code::kInvalidArgument);
}


Status OpenAndBind(const std::string& directory) {
  Result<std::unique_ptr<Checkpoint>> checkpoint = Checkpoint::Open(directory);
  if (!checkpoint.ok()) return checkpoint.status();
  Result<ModelWeights> weights = BindWeights((*checkpoint)->config(), (*checkpoint)->tensors(), directory);
  return weights.ok() ? OkStatus() : weights.status();
}

TEST(TransformerCheckpoint, MissingFilesAreNamed) {
  TempDir dir;
  Status none = OpenAndBind(dir.path());
  EXPECT_EQ(none.code(), Code::kNotFound);
  EXPECT_TRUE(Contains(none.message(), "config.json")) << none.message();
  std::ofstream(dir.path() + "/config.json") << ConfigJson(RandomCheckpoint{});
  Status no_weights = OpenAndBind(dir.path());
  EXPECT_EQ(no_weights.code(), Code::kNotFound);
  EXPECT_TRUE(Contains(no_weights.message(), "model.safetensors")) << no_weights.message();
}

TEST(TransformerCheckpoint, TensorsThatDisagreeWithTheConfigAreRefusedByName) {
  TempDir dir;
  RandomCheckpoint spec;
  ASSERT_TRUE(WriteRandomCheckpoint(dir.path(), spec).ok());
  ASSERT_TRUE(OpenAndBind(dir.path()).ok());

  // The same weights under a config that disagrees with them.
  auto with_config = [&](const std::function<void(Json&)>& edit) {
    Json json = BaseConfig();
    edit(json);
    std::ofstream(dir.path() + "/config.json", std::ios::trunc) << json.dump();
    return OpenAndBind(dir.path());
  };
  Status wider = with_config([](Json& j) { j["intermediate_size"] = 256; });
  EXPECT_EQ(wider.code(), Code::kInvalidArgument);
  EXPECT_TRUE(Contains(wider.message(), "mlp.gate_proj.weight\" is [128, 64], the config makes it [256, 64]"))
      << wider.message();
  Status deeper = with_config([](Json& j) { j["num_hidden_layers"] = 3; });
  EXPECT_TRUE(Contains(deeper.message(), "model.layers.2.input_layernorm.weight\" is missing")) << deeper.message();
  Status shallower = with_config([](Json& j) { j["num_hidden_layers"] = 1; });
  EXPECT_TRUE(Contains(shallower.message(), "\"model.layers.1.")) << shallower.message();
  EXPECT_TRUE(Contains(shallower.message(), "not part of a llama model")) << shallower.message();
  Status qwen3 = with_config([](Json& j) { j["model_type"] = "qwen3"; });
  EXPECT_TRUE(Contains(qwen3.message(), "q_norm.weight\" is missing")) << qwen3.message();
  Status tied = with_config([](Json& j) { j["tie_word_embeddings"] = true; });
  EXPECT_TRUE(tied.ok()) << "a tied model may carry a copy of its embedding: " << tied.ToString();
}

TEST(TransformerCheckpoint, AShardIndexNamingAFileOutsideTheDirectoryIsRefused) {
  TempDir dir;
  RandomCheckpoint spec;
  spec.shards = 2;
  ASSERT_TRUE(WriteRandomCheckpoint(dir.path(), spec).ok());
  ASSERT_TRUE(OpenAndBind(dir.path()).ok());
  std::ofstream(dir.path() + "/model.safetensors.index.json", std::ios::trunc)
      << R"({"weight_map": {"model.norm.weight": "../elsewhere.safetensors"}})";
  Status outside = OpenAndBind(dir.path());
  EXPECT_EQ(outside.code(), Code::kInvalidArgument);
  EXPECT_TRUE(Contains(outside.message(), "not a file name in the directory")) << outside.message();
  std::ofstream(dir.path() + "/model.safetensors.index.json", std::ios::trunc) << "{}";
  EXPECT_EQ(OpenAndBind(dir.path()).code(), Code::kInvalidArgument);
}

TEST(TransformerModel, BadRunsAreRefusedAndANaNWeightGivesNaNLogits) {
  TempDir dir;
  RandomCheckpoint spec;
  ASSERT_TRUE(WriteRandomCheckpoint(dir.path(), spec).ok());
  Result<std::unique_ptr<Checkpoint>> checkpoint = Checkpoint::Open(dir.path());
  ASSERT_TRUE(checkpoint.ok());
  Result<ModelWeights> weights = BindWeights((*checkpoint)->config(), (*checkpoint)->tensors(), dir.path());
  ASSERT_TRUE(weights.ok());
  CpuModel model((*checkpoint)->config(), *weights, 1);
  KvCache cache((*checkpoint)->config(), 4);
  std::vector<float> logits(spec.vocab_size);
  const int32_t outside[] = {1, 256};
  EXPECT_EQ(model.Forward(outside, 0, cache, logits).code(), Code::kInvalidArgument);
  const int32_t negative[] = {-1};
  EXPECT_EQ(model.Forward(negative, 0, cache, logits).code(), Code::kInvalidArgument);
  const int32_t five[] = {1, 2, 3, 4, 5};
  Status past = model.Forward(five, 0, cache, logits);
  EXPECT_EQ(past.code(), Code::kInvalidArgument);
  EXPECT_TRUE(Contains(past.message(), "past the context of 4 tokens")) << past.message();
  EXPECT_EQ(model.Forward({}, 0, cache, logits).code(), Code::kInvalidArgument);
  std::vector<float> short_logits(spec.vocab_size - 1);
  EXPECT_EQ(model.Forward({five, 1}, 0, cache, short_logits).code(), Code::kInvalidArgument);

  // A NaN in one embedding row: that token's logits are NaN, and the model keeps running others.
  ModelWeights poisoned = *weights;
  std::vector<uint8_t> embed(reinterpret_cast<const uint8_t*>(weights->embed.data),
                             reinterpret_cast<const uint8_t*>(weights->embed.data) +
                                 uint64_t{weights->embed.rows} * weights->embed.cols * 4);
  const float nan = NAN;
  std::memcpy(embed.data() + 7 * spec.hidden_size * 4, &nan, 4);
  poisoned.embed.data = embed.data();
  CpuModel poisoned_model((*checkpoint)->config(), poisoned, 1);
  KvCache fresh((*checkpoint)->config(), 4);
  const int32_t seven[] = {7};
  ASSERT_TRUE(poisoned_model.Forward(seven, 0, fresh, logits).ok());
  for (float v : logits) EXPECT_TRUE(std::isnan(v));
  KvCache other((*checkpoint)->config(), 4);
  const int32_t three[] = {3};
  ASSERT_TRUE(poisoned_model.Forward(three, 0, other, logits).ok());
  for (float v : logits) EXPECT_TRUE(std::isfinite(v));
}

// A base model saved alone (an embedding model's checkpoint: tensors without "model.", no
// lm_head, the base class as its architecture) binds and computes the same final states as its
// causal-LM twin of the same weights; it has no logits to give, and asking for them writes nothing.
TEST(TransformerModel, ABaseModelSavedAloneEmbedsAsItsTwinAndGivesNoLogits) {
  TempDir full_dir, base_dir;
  RandomCheckpoint spec;
  spec.seed = 5;
  ASSERT_TRUE(WriteRandomCheckpoint(full_dir.path(), spec).ok());
  spec.base_model_only = true;
  ASSERT_TRUE(WriteRandomCheckpoint(base_dir.path(), spec).ok());
  Result<std::unique_ptr<Checkpoint>> full = Checkpoint::Open(full_dir.path());
  Result<std::unique_ptr<Checkpoint>> base = Checkpoint::Open(base_dir.path());
  ASSERT_TRUE(full.ok() && base.ok());
  EXPECT_EQ((*base)->tensors().count("embed_tokens.weight"), 1u);
  EXPECT_EQ((*base)->tensors().count("lm_head.weight"), 0u);
  Result<ModelWeights> full_weights = BindWeights((*full)->config(), (*full)->tensors(), full_dir.path());
  Result<ModelWeights> base_weights = BindWeights((*base)->config(), (*base)->tensors(), base_dir.path());
  ASSERT_TRUE(full_weights.ok() && base_weights.ok()) << base_weights.status().ToString();
  EXPECT_EQ(base_weights->lm_head.data, nullptr);
  EXPECT_EQ(base_weights->bytes, full_weights->bytes - uint64_t{spec.vocab_size} * spec.hidden_size * 4);
  CpuModel full_model((*full)->config(), *full_weights, 1), base_model((*base)->config(), *base_weights, 1);
  KvCache full_cache((*full)->config(), 320), base_cache((*base)->config(), 320);
  const int32_t tokens[] = {3, 17, 200, 9};
  std::vector<float> want(spec.hidden_size), got(spec.hidden_size);
  ASSERT_TRUE(full_model.Hidden(tokens, 0, full_cache, want).ok());
  ASSERT_TRUE(base_model.Hidden(tokens, 0, base_cache, got).ok());
  EXPECT_EQ(got, want);
  std::vector<float> logits(spec.vocab_size, 7.0f);
  KvCache fresh((*base)->config(), 8);
  Status forward = base_model.Forward(tokens, 0, fresh, logits);
  EXPECT_EQ(forward.code(), Code::kFailedPrecondition);
  EXPECT_TRUE(Contains(forward.message(), "no output head")) << forward.message();
  const StepRun run{&fresh, 0, 4};
  EXPECT_EQ(base_model.Step(tokens, {&run, 1}, logits).code(), Code::kFailedPrecondition);
  EXPECT_EQ(fresh.length(), 0u) << "nothing computed, nothing written";
  EXPECT_EQ(logits, std::vector<float>(spec.vocab_size, 7.0f));
  // An input longer than a prefill piece embeds too (its earlier pieces ask no logits either).
  std::vector<int32_t> long_input(300);
  for (size_t i = 0; i < long_input.size(); ++i) long_input[i] = static_cast<int32_t>(i * 7 % spec.vocab_size);
  CpuSequence full_sequence(full_model, full_cache), base_sequence(base_model, base_cache);
  ASSERT_TRUE(EmbedTokens(full_sequence, long_input, want).ok());
  Status embedded = EmbedTokens(base_sequence, long_input, got);
  ASSERT_TRUE(embedded.ok()) << embedded.ToString();
  EXPECT_EQ(got, want);
  // Its config names the base class, as Hugging Face writes a base model's.
  Json config = Json::parse(ConfigJson(spec));
  EXPECT_EQ(config["architectures"][0], "LlamaModel");
  // A causal LM's checkpoint (its tensors under "model.") that lost its head is refused, by name.
  std::map<std::string, TensorView> headless = (*full)->tensors();
  headless.erase("lm_head.weight");
  Result<ModelWeights> refused = BindWeights((*full)->config(), headless, full_dir.path());
  EXPECT_EQ(refused.status().code(), Code::kInvalidArgument);
  EXPECT_TRUE(Contains(refused.status().message(), "lm_head.weight")) << refused.status().ToString();
}

}  // namespace
}  // namespace warmpool::transformer
