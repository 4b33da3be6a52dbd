// The transformer engine behind the C ABI (engines/transformer/engine.cc): opened from a model
// directory's descriptor, loaded into a shareable region, attached elsewhere from its description
// and that region alone, generating the tokens the in-process path generates; stop strings and
// cancellation; and the bad input of a request or a directory refused by name.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <limits>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/file_version.h"
#include "devmem/host_memory.h"
#include "engines/builtin.h"
#include "engines/catalog/builtin_engines.h"
#include "engines/transformer/generation.h"
#include "engines/transformer/model_directory.h"
#include "engines/transformer/stop_strings.h"
#include "tests/text.h"
#include "tests/unit/temp_dir.h"
#include "tests/unit/tiny_model.h"
#include "tests/unit/transformer_engine_fixture.h"

namespace warmpool::transformer {
namespace {

using warmpool::testing::Contains;
using warmpool::testing::TempDir;

// StopStrings: nothing of a stop string is ever sent, wherever the pieces split it.
TEST(StopStringsTest, TextBeforeTheFirstStopGoesOutAndNothingOfTheStopDoes) {
  StopStrings stops({"\n\n", "END"});
  std::string out;
  for (std::string_view piece : {"Hello", " E", "N", "D?", " no"}) out += stops.Push(piece);
  EXPECT_EQ(out, "Hello ");
  EXPECT_TRUE(stops.stopped());
  EXPECT_EQ(stops.Push("more"), "");
  EXPECT_EQ(stops.Finish(), "");
}

TEST(StopStringsTest, HeldBackTextThatTurnsOutNotToBeAStopIsSentWhole) {
  StopStrings stops({"ab"});
  EXPECT_EQ(stops.Push("xa"), "x") << "'a' may begin the stop";
  EXPECT_EQ(stops.Push("c"), "ac");
  EXPECT_EQ(stops.Push("a"), "");
  EXPECT_EQ(stops.Finish(), "a") << "the end of the text releases what waited";
  EXPECT_FALSE(stops.stopped());
}

TEST(StopStringsTest, EmptyStopsAreIgnoredAndMultibyteTextIsNeverSplit) {
  StopStrings stops({"", "\xc3\xa9t\xc3\xa9"});  // "été"
  std::string out = stops.Push("un \xc3\xa9");
  EXPECT_EQ(out, "un ") << "'é' may begin 'été': held back whole";
  out += stops.Push("t\xc3\xa9!");
  EXPECT_EQ(out, "un ");
  EXPECT_TRUE(stops.stopped());
  StopStrings none({});
  EXPECT_EQ(none.Push("abc"), "abc");
}

TEST_F(TransformerEngineTest, LoadedThroughTheAbiItGeneratesWhatTheInProcessPathDoes) {
  Result<Engine> engine = OpenDirectory();
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  const wp_engine_info& info = engine->info();
  EXPECT_EQ(info.context, 2048u) << "the model's max_position_embeddings, under the default";
  // The tiny model's weights are bf16: so is its KV cache, where this CPU can keep one.
  const uint64_t element = HaveBF16KvCache(16) ? 2 : 4;
  EXPECT_EQ(info.kv_bytes_per_token, uint64_t{2} * 2 * 2 * 16 * element) << "k and v, 2 layers, 2 kv heads of 16";
  EXPECT_GE(info.workspace_bytes, info.kv_bytes_per_token * info.context);
  ASSERT_TRUE(engine->Load().ok());
  const std::string prompt = "This program is free software";
  Result<Output> out = Run(*engine, Greedy(prompt, 24));
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(out->tokens, Reference(prompt, 24));
  EXPECT_EQ(out->result.completion_tokens, out->tokens.size());
  EXPECT_GT(out->result.prompt_tokens, 1u);
}

TEST_F(TransformerEngineTest, AnAttachFromTheDescriptionAndTheRegionAloneGeneratesTheSame) {
  Result<Engine> loaded = OpenDirectory();
  ASSERT_TRUE(loaded.ok() && loaded->Load().ok());
  Result<std::string> header = loaded->Describe();
  ASSERT_TRUE(header.ok());
  Result<wp_region> region = loaded->ExportWeights();
  ASSERT_TRUE(region.ok());
  EXPECT_EQ(region->bytes, loaded->info().weight_bytes);
  // The directory goes: the attach needs none of it.
  close(directory_);
  directory_ = -1;
  std::filesystem::remove_all(dir_.path());
  wp_engine_spec spec = SpecForFile("tiny", "", reinterpret_cast<const uint8_t*>(header->data()), header->size(), 0);
  Result<Engine> attached = Engine::Open(FindBuiltinEngine("transformer"), spec, memory_.service());
  ASSERT_TRUE(attached.ok()) << attached.status().ToString();
  EXPECT_EQ(attached->info().weight_bytes, loaded->info().weight_bytes);
  wp_region imported{};
  ASSERT_EQ(memory_.service()->import(memory_.service()->ctx, region->handle, region->bytes, &imported), WP_OK);
  ASSERT_TRUE(attached->Attach(imported).ok());
  const std::string prompt = "the GNU General Public License";
  Result<Output> a = Run(*loaded, Greedy(prompt, 16));
  Result<Output> b = Run(*attached, Greedy(prompt, 16));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->tokens, b->tokens);
  EXPECT_EQ(a->text, b->text);
}

// Device memory (a service that is not host-addressable) where no GPU computes: this build's GPU
// module is absent, or its CUDA runtime finds no driver. The weights go in and come back through the
// service's write and read, and the engine generates on the CPU from a host copy, the same tokens.
TEST_F(TransformerEngineTest, OnDeviceMemoryWithNoGpuToComputeItGeneratesFromAHostCopy) {
  wp_device_memory device = *memory_.service();
  device.host_addressable = 0;
  wp_engine_spec spec = SpecForFile("tiny", dir_.path().c_str(), nullptr, 0, 0);
  spec.has_directory = 1;
  spec.directory_fd = directory_;
  Result<Engine> engine = Engine::Open(FindBuiltinEngine("transformer"), spec, &device);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  Status loaded = engine->Load();
  ASSERT_TRUE(loaded.ok()) << loaded.ToString();
  const std::string prompt = "This program is free software";
  Result<Output> out = Run(*engine, Greedy(prompt, 24));
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(out->tokens, Reference(prompt, 24, /*on_device=*/true));

  wp_device_memory no_copies = device;
  no_copies.read = nullptr;
  Result<Engine> refused = Engine::Open(FindBuiltinEngine("transformer"), spec, &no_copies);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), Code::kFailedPrecondition);
}

// A long prompt runs in pieces; between them the engine reports progress (a chunk of no text and
// no tokens), which is where a client that left stops it before its first token.
TEST_F(TransformerEngineTest, ALongPromptReportsProgressBetweenItsPiecesAndStopsThere) {
  Result<Engine> engine = OpenDirectory();
  ASSERT_TRUE(engine.ok() && engine->Load().ok());
  std::vector<int32_t> prompt(2 * kPrefillPiece + 100);
  for (size_t i = 0; i < prompt.size(); i++) prompt[i] = static_cast<int32_t>(100 + i % 50);
  wp_generate_request r = Greedy("", 4);
  r.prompt = {nullptr, 0};
  r.tokens = prompt.data();
  r.token_count = static_cast<uint32_t>(prompt.size());
  int progress = 0, tokens = 0;
  Result<wp_generate_result> done = engine->Generate(r, [&](std::string_view text, std::span<const int32_t> t, std::span<const wp_token_logprobs>) {
    if (text.empty() && t.empty()) {
      EXPECT_EQ(tokens, 0) << "progress comes before the first token";
      progress++;
    }
    tokens += static_cast<int>(t.size());
    return true;
  });
  ASSERT_TRUE(done.ok()) << done.status().ToString();
  EXPECT_EQ(progress, 2) << "between three pieces";
  EXPECT_EQ(done->completion_tokens, 4u);
  EXPECT_EQ(done->prompt_tokens, prompt.size());

  Result<wp_generate_result> stopped =
      engine->Generate(r, [&](std::string_view, std::span<const int32_t>, std::span<const wp_token_logprobs>) { return false; });
  ASSERT_TRUE(stopped.ok()) << stopped.status().ToString();
  EXPECT_EQ(stopped->finish_reason, static_cast<uint32_t>(WP_FINISH_CANCELLED));
  EXPECT_EQ(stopped->completion_tokens, 0u) << "stopped at the first progress, within the prompt";
}

TEST_F(TransformerEngineTest, AStopStringEndsTheTextBeforeItAndAStopFromTheClientWithinAStep) {
  Result<Engine> engine = OpenDirectory();
  ASSERT_TRUE(engine.ok() && engine->Load().ok());
  const std::string prompt = "the terms and conditions";
  Result<Output> full = Run(*engine, Greedy(prompt, 32));
  ASSERT_TRUE(full.ok());
  ASSERT_GT(full->text.size(), 6u);
  // A stop string from the middle of what it says: the text ends just before it.
  const std::string stop = full->text.substr(full->text.size() / 2, 2);
  wp_generate_request r = Greedy(prompt, 32);
  wp_string stops[] = {{stop.data(), stop.size()}};
  r.stop = stops;
  r.stop_count = 1;
  Result<Output> stopped = Run(*engine, r);
  ASSERT_TRUE(stopped.ok());
  EXPECT_EQ(stopped->result.finish_reason, WP_FINISH_STOP);
  EXPECT_EQ(stopped->text, full->text.substr(0, full->text.find(stop)));
  // The emit callback says stop at its third call: three tokens, and the generation says why.
  Result<Output> cancelled = Run(*engine, Greedy(prompt, 32), /*stop_after=*/3);
  ASSERT_TRUE(cancelled.ok());
  EXPECT_EQ(cancelled->result.finish_reason, WP_FINISH_CANCELLED);
  EXPECT_EQ(cancelled->tokens.size(), 3u);
  EXPECT_EQ(cancelled->result.completion_tokens, 3u);
}

TEST_F(TransformerEngineTest, BadRequestsAreRefusedByNameAndTheEngineKeepsServing) {
  Result<Engine> engine = OpenDirectory();
  ASSERT_TRUE(engine.ok() && engine->Load().ok());
  auto refused = [&](const wp_generate_request& r, const char* says) {
    Result<Output> out = Run(*engine, r);
    ASSERT_FALSE(out.ok()) << says;
    EXPECT_EQ(out.status().code(), Code::kInvalidArgument) << out.status().ToString();
    EXPECT_TRUE(Contains(out.status().message(), says)) << out.status().message();
  };
  wp_generate_request nan = Greedy("x", 4);
  nan.temperature = std::numeric_limits<float>::quiet_NaN();
  refused(nan, "temperature");
  wp_generate_request negative = Greedy("x", 4);
  negative.set |= WP_SET_TOP_P;
  negative.top_p = -1;
  refused(negative, "top_p");
  const std::string huge(20000, 'z');  // past the context of 2048 tokens
  refused(Greedy(huge, 4), "context");
  const int32_t outside[] = {1, 1 << 30};
  wp_generate_request tokens = Greedy("", 4);
  tokens.tokens = outside;
  tokens.token_count = 2;
  refused(tokens, "vocabulary");
  std::vector<wp_string> many(17, wp_string{"a", 1});
  wp_generate_request stops = Greedy("x", 4);
  stops.stop = many.data();
  stops.stop_count = 17;
  refused(stops, "stop strings");
  EXPECT_TRUE(Run(*engine, Greedy("still here", 4)).ok());
}

// A conversation goes through the model's chat template (engines/chat_template), its special tokens
// written by the template, not added again: the same tokens as the rendered prompt given as text.
TEST_F(TransformerEngineTest, MessagesAreRenderedByTheChatTemplate) {
  const char* kTemplate =
      "{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content }}{{ eos_token }}{% endfor %}"
      "{% if add_generation_prompt %}assistant:{% endif %}";
  std::ofstream(dir_.File("tokenizer_config.json"))
      << nlohmann::json{{"bos_token", "<|begin_of_text|>"}, {"eos_token", "<|end|>"}, {"chat_template", kTemplate}}.dump();
  Result<Engine> engine = OpenDirectory();
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  ASSERT_TRUE(engine->Load().ok());
  const std::string roles[] = {"system", "user"}, contents[] = {"Be brief.", "Who wrote this License?"};
  wp_string r[] = {{roles[0].data(), roles[0].size()}, {roles[1].data(), roles[1].size()}};
  wp_string c[] = {{contents[0].data(), contents[0].size()}, {contents[1].data(), contents[1].size()}};
  wp_generate_request chat = Greedy("", 12);
  chat.roles = r;
  chat.contents = c;
  chat.message_count = 2;
  Result<Output> chatted = Run(*engine, chat);
  ASSERT_TRUE(chatted.ok()) << chatted.status().ToString();
  // The same prompt, rendered here and tokenized without special tokens (the template wrote BOS).
  Result<ModelDirectory> m = ModelDirectory::Open(dir_.path());
  ASSERT_TRUE(m.ok());
  const std::string rendered =
      "<|begin_of_text|>system: Be brief.<|end|>user: Who wrote this License?<|end|>assistant:";
  Result<std::vector<int32_t>> ids = m->tokenizer->Encode(rendered, /*add_special_tokens=*/false);
  ASSERT_TRUE(ids.ok());
  wp_generate_request tokens = Greedy("", 12);
  tokens.tokens = ids->data();
  tokens.token_count = ids->size();
  Result<Output> direct = Run(*engine, tokens);
  ASSERT_TRUE(direct.ok());
  EXPECT_EQ(chatted->tokens, direct->tokens);
  EXPECT_EQ(chatted->result.prompt_tokens, ids->size());
}

TEST_F(TransformerEngineTest, AChatWithoutATemplateOrWithOneThatRaisesIsATypedError) {
  Result<Engine> engine = OpenDirectory();  // tokenizer_config.json has no chat_template
  ASSERT_TRUE(engine.ok() && engine->Load().ok());
  const std::string role = "user", content = "hi";
  wp_string r[] = {{role.data(), role.size()}}, c[] = {{content.data(), content.size()}};
  wp_generate_request chat = Greedy("", 4);
  chat.roles = r;
  chat.contents = c;
  chat.message_count = 1;
  Result<Output> none = Run(*engine, chat);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), Code::kFailedPrecondition);
  EXPECT_TRUE(Contains(none.status().message(), "chat template")) << none.status().message();

  std::ofstream(dir_.File("tokenizer_config.json"))
      << nlohmann::json{{"eos_token", "<|end|>"}, {"chat_template", "{{ raise_exception('Roles must alternate') }}"}}.dump();
  Result<Engine> raising = OpenDirectory();
  ASSERT_TRUE(raising.ok() && raising->Load().ok());
  Result<Output> raised = Run(*raising, chat);
  ASSERT_FALSE(raised.ok());
  EXPECT_EQ(raised.status().code(), Code::kInvalidArgument);
  EXPECT_TRUE(Contains(raised.status().message(), "Roles must alternate")) << raised.status().message();

  // A template that does not parse refuses the model when it is read (its registration).
  std::ofstream(dir_.File("tokenizer_config.json"))
      << nlohmann::json{{"eos_token", "<|end|>"}, {"chat_template", "{% for m in messages %}"}}.dump();
  Result<Engine> broken = OpenDirectory();
  ASSERT_FALSE(broken.ok());
  EXPECT_TRUE(Contains(broken.status().message(), "tokenizer_config.json")) << broken.status().message();
}

TEST_F(TransformerEngineTest, ASymlinkInTheDirectoryIsRefusedNotFollowed) {
  ASSERT_EQ(rename(dir_.File("tokenizer_config.json").c_str(), dir_.File("elsewhere.json").c_str()), 0);
  ASSERT_EQ(symlink("elsewhere.json", dir_.File("tokenizer_config.json").c_str()), 0);
  Result<Engine> engine = OpenDirectory();
  ASSERT_FALSE(engine.ok());
  EXPECT_TRUE(Contains(engine.status().message(), "symlink")) << engine.status().message();
}


TEST_F(TransformerEngineTest, ADirectoryIsNotForAVersion2EngineNorAFileForThisOne) {
  wp_engine_vtable old = *FindBuiltinEngine("transformer");
  old.abi_version = 2;
  wp_engine_spec spec = SpecForFile("tiny", dir_.path().c_str(), nullptr, 0, 0);
  spec.has_directory = 1;
  spec.directory_fd = directory_;
  Result<Engine> engine = Engine::Open(&old, spec, memory_.service());
  ASSERT_FALSE(engine.ok());
  EXPECT_TRUE(Contains(engine.status().message(), "directory")) << engine.status().message();
  wp_engine_spec file = SpecForFile("tiny", dir_.File("model.safetensors").c_str(), nullptr, 0, 0);
  Result<Engine> not_a_directory = Engine::Open(FindBuiltinEngine("transformer"), file, memory_.service());
  ASSERT_FALSE(not_a_directory.ok());
  EXPECT_TRUE(Contains(not_a_directory.status().message(), "directory")) << not_a_directory.status().message();
}

TEST_F(TransformerEngineTest, TheDirectorysVersionChangesWithAnyFileInIt) {
  const FileVersion before = DirectoryVersion(directory_);
  ASSERT_TRUE(before.known());
  EXPECT_EQ(DirectoryVersion(directory_), before);
  // What the model is not made of (a README, a lock written beside it) is no new version.
  std::ofstream(dir_.File("README.md")) << "# a model";
  std::ofstream(dir_.File(".lock")) << "1";
  EXPECT_EQ(DirectoryVersion(directory_), before);
  std::ofstream(dir_.File("generation_config.json")) << R"({"eos_token_id": 3})";
  const FileVersion added = DirectoryVersion(directory_);
  EXPECT_NE(added, before);
  // Replaced by a file of the same size and times: its inode tells.
  const std::string config = dir_.File("config.json");
  struct stat st {};
  ASSERT_EQ(stat(config.c_str(), &st), 0);
  std::filesystem::copy_file(config, config + ".new");
  ASSERT_EQ(rename((config + ".new").c_str(), config.c_str()), 0);
  const FileVersion replaced = DirectoryVersion(directory_);
  EXPECT_NE(replaced, added);
  // A sentence-transformers module's configuration, a level down, is part of the model; what lies
  // deeper, a module's weights, and other trees (a download tool's .cache, the original
  // checkpoint, a trainer's checkpoints) are not.
  std::filesystem::create_directories(dir_.File("1_Pooling/deeper"));
  for (const char* other : {".cache", "original", "checkpoint-500", "1_", "_Pooling"}) {
    std::filesystem::create_directories(dir_.File(other));
    std::ofstream(dir_.File(std::string(other) + "/config.json")) << "{}";
  }
  std::ofstream(dir_.File("1_Pooling/deeper/config.json")) << "{}";
  std::ofstream(dir_.File("1_Pooling/model.safetensors")) << "weights";
  EXPECT_EQ(DirectoryVersion(directory_), replaced);
  std::ofstream(dir_.File("1_Pooling/config.json")) << R"({"pooling_mode_lasttoken": true})";
  const FileVersion pooled = DirectoryVersion(directory_);
  EXPECT_NE(pooled, replaced);
  std::ofstream(dir_.File("1_Pooling/config.json")) << R"({"pooling_mode_mean_tokens": true})";
  EXPECT_NE(DirectoryVersion(directory_), pooled) << "rewritten with another size";
  EXPECT_FALSE(DirectoryVersion(-1).known());
}

}  // namespace
}  // namespace warmpool::transformer
