// The shipped model (demo/license-llama, trained by scripts/train-demo-model.py with PyTorch from
// the architecture's definition): warmpool's engine, through the C ABI as a worker runs it, repeats
// the training script's own greedy continuations token for token, and a chat through its template
// says something.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "devmem/host_memory.h"
#include "engines/builtin.h"
#include "engines/catalog/builtin_engines.h"
#include "engines/transformer/model_directory.h"

namespace warmpool::transformer {
namespace {

std::string DemoDirectory() {
  const char* override_dir = std::getenv("WARMPOOL_DEMO_MODEL");
  return override_dir != nullptr ? override_dir : std::string(WARMPOOL_SOURCE_DIR) + "/demo/license-llama";
}

class DemoModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const int dir = open(directory_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    ASSERT_GE(dir, 0) << directory_;
    wp_engine_spec spec = SpecForFile("license-llama", directory_.c_str());  // the spec borrows it
    spec.has_directory = 1;
    spec.directory_fd = dir;
    Result<Engine> engine = Engine::Open(FindBuiltinEngine("transformer"), spec, memory_.service());
    if (engine.ok()) {
      Status loaded = engine->Load();
      ASSERT_TRUE(loaded.ok()) << loaded.ToString();
      engine_.emplace(std::move(*engine));
    }
    close(dir);
    ASSERT_TRUE(engine_) << engine.status().ToString();
  }
  std::vector<int32_t> Greedy(wp_generate_request r, std::string* text = nullptr) {
    r.set |= WP_SET_TEMPERATURE;
    r.temperature = 0;
    std::vector<int32_t> tokens;
    Result<wp_generate_result> done = engine_->Generate(r, [&](std::string_view t, std::span<const int32_t> ids, std::span<const wp_token_logprobs>) {
      tokens.insert(tokens.end(), ids.begin(), ids.end());
      if (text != nullptr) *text += t;
      return true;
    });
    EXPECT_TRUE(done.ok()) << done.status().ToString();
    return tokens;
  }
  const std::string directory_ = DemoDirectory();
  HostMemory memory_;
  std::optional<Engine> engine_;
};

TEST_F(DemoModelTest, GreedyContinuationsAreTheTrainingScriptsOwn) {
  std::ifstream in(directory_ + "/expected.json");
  const nlohmann::json expected = nlohmann::json::parse(in);
  ASSERT_GE(expected.size(), 4u);
  for (const nlohmann::json& e : expected) {
    const std::string prompt = e["prompt"];
    wp_generate_request r{};
    r.prompt = {prompt.data(), prompt.size()};
    r.max_tokens = 64;
    std::string text;
    EXPECT_EQ(Greedy(r, &text), e["tokens"].get<std::vector<int32_t>>()) << prompt << text;
  }
}

TEST_F(DemoModelTest, AChatThroughItsTemplateSaysSomething) {
  const std::string role = "user", content = "What may I do with this program?";
  wp_string roles[] = {{role.data(), role.size()}}, contents[] = {{content.data(), content.size()}};
  wp_generate_request r{};
  r.roles = roles;
  r.contents = contents;
  r.message_count = 1;
  r.max_tokens = 24;
  std::string text;
  EXPECT_FALSE(Greedy(r, &text).empty());
  EXPECT_FALSE(text.empty());
}

}  // namespace
}  // namespace warmpool::transformer
