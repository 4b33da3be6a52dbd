// The transformer engine behind its C ABI, on a tiny model directory (tests/unit/tiny_model.h)
// in host memory: the fixture of transformer_engine_test.cc and transformer_outputs_test.cc.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include "devmem/host_memory.h"
#include "engines/builtin.h"
#include "engines/catalog/builtin_engines.h"
#include "engines/transformer/decode_attention.h"
#include "engines/transformer/generation.h"
#include "engines/transformer/model_directory.h"
#include "tests/unit/temp_dir.h"
#include "tests/unit/tiny_model.h"

namespace warmpool::transformer {

class TransformerEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    warmpool::testing::WriteTinyModel(dir_.path(), spec_);
    directory_ = open(dir_.path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    ASSERT_GE(directory_, 0);
  }
  void TearDown() override { close(directory_); }

  Result<Engine> OpenDirectory() {
    wp_engine_spec spec = SpecForFile("tiny", dir_.path().c_str(), nullptr, 0, 0);
    spec.has_directory = 1;
    spec.directory_fd = directory_;
    return Engine::Open(FindBuiltinEngine("transformer"), spec, memory_.service());
  }
  // Opened with these settings (0: the engine's defaults) and loaded.
  Result<Engine> LoadDirectory(uint32_t context, uint32_t sequences, uint64_t kv_tokens = 0) {
    wp_engine_spec spec = SpecForFile("tiny", dir_.path().c_str(), nullptr, 0, 0);
    spec.has_directory = 1;
    spec.directory_fd = directory_;
    spec.context = context;
    spec.sequences = sequences;
    spec.kv_tokens = kv_tokens;
    Result<Engine> engine = Engine::Open(FindBuiltinEngine("transformer"), spec, memory_.service());
    if (engine.ok()) {
      if (Status s = engine->Load(); !s.ok()) return s;
    }
    return engine;
  }
  // What the in-process path generates greedily from the same directory.
  // The model's config as the engine serves it: its KV cache's element chosen as the engine chooses
  // it, so that an in-process path computes what the engine does.
  // `on_device`: in device memory (whose CPU fallback keeps f32, as a GPU does).
  static Config Served(const ModelDirectory& m, bool on_device = false) {
    Config c = m.checkpoint->config();
    Result<ModelWeights> w = BindWeights(c, m.checkpoint->tensors(), "tiny");
    c.kv_element = ChooseKvElement(w.ok() ? w->layers[0].k.dtype : safetensors::DType::F32, c.head_dim, on_device);
    return c;
  }
  std::vector<int32_t> Reference(const std::string& prompt, uint32_t max_tokens, bool on_device = false) {
    Result<ModelDirectory> m = ModelDirectory::Open(dir_.path());
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    const Config config = Served(*m, on_device);
    Result<ModelWeights> weights = BindWeights(config, m->checkpoint->tensors(), "tiny");
    CpuModel model(config, *weights, 1);
    KvCache cache(config, 2048);
    GenerationRequest request;
    request.prompt = *m->tokenizer->Encode(prompt, /*add_special_tokens=*/true);
    request.max_tokens = max_tokens;
    request.sampling.temperature = 0;
    request.end_tokens = m->end_tokens;
    return Generate(model, cache, request)->tokens;
  }
  struct Output {
    std::string text;
    std::vector<int32_t> tokens;
    wp_generate_result result{};
  };
  static Result<Output> Run(Engine& engine, const wp_generate_request& request, int stop_after = -1) {
    Output out;
    int steps = 0;
    Result<wp_generate_result> result =
        engine.Generate(request, [&](std::string_view text, std::span<const int32_t> t, std::span<const wp_token_logprobs>) {
          out.text += text;
          out.tokens.insert(out.tokens.end(), t.begin(), t.end());
          return ++steps != stop_after;
        });
    if (!result.ok()) return result.status();
    out.result = *result;
    return out;
  }
  // prompt must outlive the request (a literal, or a string of the caller's).
  static wp_generate_request Greedy(std::string_view prompt, uint32_t max_tokens) {
    wp_generate_request r{};
    r.prompt = {prompt.data(), prompt.size()};
    r.max_tokens = max_tokens;
    r.set = WP_SET_TEMPERATURE;
    r.temperature = 0;
    return r;
  }

  RandomCheckpoint spec_{.dtype = safetensors::DType::BF16};
  warmpool::testing::TempDir dir_;
  int directory_ = -1;
  HostMemory memory_;
};

}  // namespace warmpool::transformer
