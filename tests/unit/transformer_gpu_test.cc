// The transformer engine on CUDA device memory (engines/transformer/gpu_sequence.h), against the
// CPU's forward pass on the same directory: logits within each dtype's rounding (f32 within 1e-4
// of the largest logit), a prompt longer than one GPU chunk, decode steps against the cache, and
// greedy generation through the engine ABI token for token in f32, for each architecture.
//
// On a GPU (scripts/gpu-check.sh) the forward pass must run there: the test fails when the GPU
// module does not start. Against the driver test double it cannot (the CUDA runtime finds no
// driver it can use): the engine must say why, copy the weights back and generate on the CPU,
// with the same tokens.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>

#include <gtest/gtest.h>

#include "devmem/host_memory.h"
#include "engines/builtin.h"
#include "engines/catalog/builtin_engines.h"
#include "engines/dense_gpu.h"
#include "engines/gpu_module.h"
#include "engines/transformer/generation.h"
#include "engines/transformer/gpu_sequence.h"
#include "engines/transformer/model_directory.h"
#include "engines/transformer/packed_model.h"
#include "tests/unit/cuda_device_fixture.h"
#include "tests/unit/temp_dir.h"
#include "tests/unit/tiny_model.h"

namespace warmpool::testing {
namespace {

using safetensors::DType;
using transformer::Architecture;
using transformer::RandomCheckpoint;

struct Variant {
  const char* name;
  RandomCheckpoint spec;
};

// Each architecture's difference from Llama, one at a time.
std::vector<Variant> Variants(DType dtype) {
  std::vector<Variant> variants;
  variants.push_back({"llama", {.architecture = Architecture::kLlama, .dtype = dtype}});
  variants.push_back({"qwen2", {.architecture = Architecture::kQwen2, .dtype = dtype}});
  variants.push_back({"qwen3", {.architecture = Architecture::kQwen3, .dtype = dtype}});
  variants.push_back({"mistral", {.architecture = Architecture::kMistral, .sliding_window = 24, .dtype = dtype}});
  variants.push_back({"llama-gqa-tied",
                      {.architecture = Architecture::kLlama, .num_attention_heads = 8, .num_key_value_heads = 1,
                       .tie_word_embeddings = true, .dtype = dtype}});
  return variants;
}

// The largest difference, relative to the largest logit of the reference (at least 1).
double WorstError(const std::vector<float>& got, const std::vector<float>& want) {
  double scale = 1, worst = 0;
  for (float w : want) scale = std::max(scale, double{std::fabs(w)});
  for (size_t i = 0; i < want.size(); i++) {
    if (std::isnan(got[i]) != std::isnan(want[i])) return INFINITY;
    worst = std::max(worst, std::fabs(double{got[i]} - want[i]));
  }
  return worst / scale;
}

// f32 as the CPU computes it; 16-bit weights multiply activations narrowed to their type (11 or 8
// significant bits into each product), through every layer.
double Tolerance(DType dtype) { return dtype == DType::F32 ? 1e-4 : dtype == DType::F16 ? 2e-2 : 6e-2; }

class TransformerGpuTest : public CudaMemoryTest {
 protected:
  struct Opened {
    Result<Engine> engine = Status(Code::kInternal, "unset");
    int directory = -1;
    ~Opened() {
      if (directory >= 0) close(directory);
    }
  };

  void OpenModel(const std::string& path, const wp_device_memory* memory, uint32_t context, Opened& out) {
    out.directory = open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    ASSERT_GE(out.directory, 0);
    wp_engine_spec spec = SpecForFile("tiny", path.c_str());
    spec.has_directory = 1;
    spec.directory_fd = out.directory;
    spec.context = context;
    out.engine = Engine::Open(FindBuiltinEngine("transformer"), spec, memory);
    ASSERT_TRUE(out.engine.ok()) << out.engine.status().ToString();
    Status loaded = out.engine->Load();
    ASSERT_TRUE(loaded.ok()) << loaded.ToString();
  }

  static std::vector<int32_t> Generate(Engine& engine, const std::string& prompt, uint32_t max_tokens) {
    wp_generate_request r{};
    r.prompt = {prompt.data(), prompt.size()};
    r.max_tokens = max_tokens;
    r.set = WP_SET_TEMPERATURE;
    r.temperature = 0;
    std::vector<int32_t> tokens;
    Result<wp_generate_result> done = engine.Generate(r, [&](std::string_view, std::span<const int32_t> t, std::span<const wp_token_logprobs>) {
      tokens.insert(tokens.end(), t.begin(), t.end());
      return true;
    });
    EXPECT_TRUE(done.ok()) << done.status().ToString();
    return tokens;
  }
};

// One module, two engines' entry points: each is its own, whichever was asked for first (a worker
// preloads the dense engine's).
TEST(GpuModuleTest, EachEntryPointOfTheModuleIsItsOwn) {
  const GpuModuleEntry& dense = LoadGpuModule(kEnginesGpuModule, dense::kGpuRunnerStartSymbol);
  const GpuModuleEntry& transformer = LoadGpuModule(kEnginesGpuModule, transformer::kGpuSequenceStartSymbol);
  ASSERT_NE(dense.entry, nullptr) << dense.why;
  ASSERT_NE(transformer.entry, nullptr) << transformer.why;
  EXPECT_NE(dense.entry, transformer.entry);
  const GpuModuleEntry& missing = LoadGpuModule(kEnginesGpuModule, "no_such_entry");
  EXPECT_EQ(missing.entry, nullptr);
  EXPECT_NE(missing.why.find("has no no_such_entry"), std::string::npos) << missing.why;
}

TEST_F(TransformerGpuTest, TheEngineOnDeviceMemoryGeneratesWhatTheHostGenerates) {
  TempDir dir;
  HostMemory host;
  for (const Variant& v : Variants(DType::F32)) {
    SCOPED_TRACE(v.name);
    const std::string path = dir.File(v.name);
    WriteTinyModelWithTokenizerOf(path, DemoModelDirectory(), v.spec);
    Opened on_device, on_host;
    OpenModel(path, memory_->service(), 512, on_device);
    OpenModel(path, host.service(), 512, on_host);
    if (HasFatalFailure()) return;
    Result<transformer::ModelDirectory> m = transformer::ModelDirectory::Open(path);
    ASSERT_TRUE(m.ok());
    EXPECT_EQ(on_device.engine->info().workspace_bytes,
              transformer::PlanGpuSequence(m->checkpoint->config(), 512).total)
        << "the KV cache and the kernels' buffers, in device memory, counted in the device budget";
    const std::string prompt = "This program is distributed in the hope that it will be useful";
    EXPECT_EQ(Generate(*on_device.engine, prompt, 32), Generate(*on_host.engine, prompt, 32));
  }
}

// The GPU's forward pass itself, started on the region the engine loaded: whole prompts (longer
// than one chunk), decode steps, and a second prompt over the first one's cache.
TEST_F(TransformerGpuTest, LogitsMatchTheCpuForEachArchitectureAndDtype) {
  TempDir dir;
  constexpr uint32_t kContext = 512;
  for (DType dtype : {DType::F32, DType::F16, DType::BF16}) {
    for (const Variant& v : Variants(dtype)) {
      const std::string name = fmt::format("{}-{}", v.name, safetensors::DTypeName(dtype));
      SCOPED_TRACE(name);
      const std::string path = dir.File(name);
      WriteTinyModelWithTokenizerOf(path, DemoModelDirectory(), v.spec);
      Opened on_device;
      OpenModel(path, memory_->service(), kContext, on_device);
      if (HasFatalFailure()) return;
      Result<std::string> header = on_device.engine->Describe();
      Result<wp_region> region = on_device.engine->ExportWeights();
      ASSERT_TRUE(header.ok() && region.ok());
      Result<transformer::PackedModel> packed = transformer::DecodeHeader(*header);
      ASSERT_TRUE(packed.ok()) << packed.status().ToString();
      std::map<std::string, transformer::TensorView> views;
      for (const transformer::PackedTensor& t : packed->tensors) {
        views.emplace(t.name, transformer::TensorView{t.name, t.dtype, t.shape,
                                                      static_cast<const uint8_t*>(region->ptr) + t.offset, t.file,
                                                      t.file_offset, t.bytes});
      }
      const transformer::Config& config = packed->config;
      Result<transformer::ModelWeights> on_gpu = transformer::BindWeights(config, views, name);
      ASSERT_TRUE(on_gpu.ok()) << on_gpu.status().ToString();
      std::string why;
      std::unique_ptr<transformer::Sequence> gpu =
          transformer::StartGpuSequence(config, *on_gpu, memory_->service(), kContext, &why);
      if (on_the_double_) {
        EXPECT_EQ(gpu, nullptr);
        EXPECT_FALSE(why.empty()) << "a GPU sequence that does not start says why";
        continue;
      }
      ASSERT_NE(gpu, nullptr) << "the GPU forward pass did not start: " << why;
      EXPECT_NE(gpu->Describe().find("cuBLAS"), std::string::npos) << gpu->Describe();

      Result<transformer::ModelDirectory> m = transformer::ModelDirectory::Open(path);
      ASSERT_TRUE(m.ok());
      Result<transformer::ModelWeights> on_host = transformer::BindWeights(config, m->checkpoint->tensors(), name);
      ASSERT_TRUE(on_host.ok());
      transformer::CpuModel model(config, *on_host, 2);
      transformer::KvCache cache(config, kContext);
      transformer::CpuSequence cpu(model, cache);

      std::mt19937 generator(7);
      std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(config.vocab_size) - 1);
      std::vector<int32_t> prompt(300);  // more than one chunk of transformer::kGpuChunkRows
      for (int32_t& t : prompt) t = token(generator);
      std::vector<float> want(config.vocab_size), got(config.vocab_size);
      auto expect_same = [&](std::span<const int32_t> tokens, uint32_t start, const std::string& what) {
        ASSERT_TRUE(cpu.Forward(tokens, start, want).ok());
        Status s = gpu->Forward(tokens, start, got);
        ASSERT_TRUE(s.ok()) << s.ToString();
        EXPECT_LE(WorstError(got, want), Tolerance(dtype)) << what;
      };
      expect_same(prompt, 0, "a 300-token prompt");
      for (uint32_t step = 0; step < 4; step++) {
        expect_same({&prompt[step], 1}, 300 + step, fmt::format("decode step {}", step));
      }
      expect_same({prompt.data() + 100, 40}, 0, "a second prompt over the first one's cache");
      // Greedy decoding's argmax on the device chooses what the host would from the same logits.
      ASSERT_TRUE(gpu->Forward({&prompt[7], 1}, 40, got).ok());
      Result<int32_t> chosen = gpu->ForwardArgMax({&prompt[7], 1}, 40);
      ASSERT_TRUE(chosen.ok()) << chosen.status().ToString();
      EXPECT_EQ(*chosen, *transformer::ArgMaxToken(got)) << "the argmax kernel";
      std::vector<float> want_hidden(config.hidden_size), got_hidden(config.hidden_size);
      ASSERT_TRUE(cpu.Hidden({prompt.data(), 30}, 0, want_hidden).ok());
      Status hidden = gpu->Hidden({prompt.data(), 30}, 0, got_hidden);
      ASSERT_TRUE(hidden.ok()) << hidden.ToString();
      EXPECT_LE(WorstError(got_hidden, want_hidden), Tolerance(dtype)) << "the final state an embedding is made of";
      EXPECT_EQ(gpu->Forward({prompt.data(), 2}, kContext - 1, got).code(), Code::kInvalidArgument)
          << "past the context";
      const int32_t outside = static_cast<int32_t>(config.vocab_size);
      EXPECT_EQ(gpu->Forward({&outside, 1}, 0, got).code(), Code::kInvalidArgument) << "outside the vocabulary";
    }
  }
}

}  // namespace
}  // namespace warmpool::testing
