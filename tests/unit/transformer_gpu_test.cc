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
#include "engines/transformer/gpu_slots.h"
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

  // The weights the engine loaded into device memory, bound where they lie (device pointers).
  static void BindLoaded(Engine& engine, const std::string& name, transformer::Config& config,
                         transformer::ModelWeights& weights) {
    Result<std::string> header = engine.Describe();
    Result<wp_region> region = engine.ExportWeights();
    ASSERT_TRUE(header.ok() && region.ok());
    Result<transformer::PackedModel> packed = transformer::DecodeHeader(*header);
    ASSERT_TRUE(packed.ok()) << packed.status().ToString();
    std::map<std::string, transformer::TensorView> views;
    for (const transformer::PackedTensor& t : packed->tensors) {
      views.emplace(t.name, transformer::TensorView{t.name, t.dtype, t.shape,
                                                    static_cast<const uint8_t*>(region->ptr) + t.offset, t.file,
                                                    t.file_offset, t.bytes});
    }
    config = packed->config;
    Result<transformer::ModelWeights> bound = transformer::BindWeights(config, views, name);
    ASSERT_TRUE(bound.ok()) << bound.status().ToString();
    weights = *bound;
  }

  // A model of this shape written, loaded onto the device by the engine, and bound where it lies.
  struct OnDevice {
    std::string path;
    Opened opened;
    transformer::Config config;
    transformer::ModelWeights weights;
  };
  void LoadOnDevice(TempDir& dir, const std::string& name, const transformer::RandomCheckpoint& spec,
                    uint32_t context, OnDevice& out) {
    out.path = dir.File(name);
    WriteTinyModelWithTokenizerOf(out.path, DemoModelDirectory(), spec);
    OpenModel(out.path, memory_->service(), context, out.opened);
    if (HasFatalFailure()) return;
    BindLoaded(*out.opened.engine, name, out.config, out.weights);
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
  const GpuModuleEntry& transformer = LoadGpuModule(kEnginesGpuModule, transformer::kGpuModelStartSymbol);
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
    const uint32_t sequences = transformer::ServedSequences(0);
    EXPECT_EQ(on_device.engine->info().workspace_bytes,
              transformer::PlanGpu(m->checkpoint->config(), 512, sequences,
                                   transformer::KvPoolBlocks(512, sequences))
                  .total)
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
      OnDevice loaded;
      LoadOnDevice(dir, name, v.spec, kContext, loaded);
      if (HasFatalFailure()) return;
      const std::string& path = loaded.path;
      const transformer::Config& config = loaded.config;
      const transformer::ModelWeights& on_gpu = loaded.weights;
      std::string why;
      std::unique_ptr<transformer::Sequence> gpu =
          transformer::StartGpuSequence(config, on_gpu, memory_->service(), kContext, &why);
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

// Continuous batching on the GPU (engines/transformer/gpu_slots.h): three sequences' prompts in
// one step, then their decodes together (one wanting only its argmax), then a prompt that takes a
// published prefix from the paged pool: each run's logits against the CPU running its sequence
// alone. Mistral's sliding window makes attention start inside a block.
TEST_F(TransformerGpuTest, SequencesSteppedTogetherMatchEachAloneOnTheCpu) {
  TempDir dir;
  constexpr uint32_t kContext = 512, kSequences = 3;
  for (DType dtype : {DType::F32, DType::BF16}) {
    for (const Variant& v : Variants(dtype)) {
      const std::string name = fmt::format("{}-{}", v.name, safetensors::DTypeName(dtype));
      SCOPED_TRACE(name);
      OnDevice loaded;
      LoadOnDevice(dir, name, v.spec, kContext, loaded);
      if (HasFatalFailure()) return;
      const std::string& path = loaded.path;
      const transformer::Config& config = loaded.config;
      const transformer::ModelWeights& on_gpu = loaded.weights;
      std::string why;
      std::unique_ptr<transformer::GpuModel> gpu = transformer::StartGpuModel(
          config, on_gpu, memory_->service(), kContext, kSequences, transformer::KvPoolBlocks(kContext, kSequences),
          &why);
      if (on_the_double_) {
        EXPECT_EQ(gpu, nullptr);
        continue;
      }
      ASSERT_NE(gpu, nullptr) << "the GPU model did not start: " << why;
      Result<std::unique_ptr<transformer::KvPool>> pool = transformer::MakeGpuPool(*gpu);
      ASSERT_TRUE(pool.ok()) << pool.status().ToString();
      transformer::KvCache first(**pool, kContext);
      transformer::GpuSlots slots(*gpu, **pool, first, kSequences);

      Result<transformer::ModelDirectory> m = transformer::ModelDirectory::Open(path);
      ASSERT_TRUE(m.ok());
      Result<transformer::ModelWeights> on_host = transformer::BindWeights(config, m->checkpoint->tensors(), name);
      ASSERT_TRUE(on_host.ok());
      transformer::CpuModel model(config, *on_host, 2);
      std::vector<std::unique_ptr<transformer::KvCache>> caches;
      for (uint32_t s = 0; s < kSequences; s++) {
        caches.push_back(std::make_unique<transformer::KvCache>(config, kContext));
      }

      std::mt19937 generator(11);
      std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(config.vocab_size) - 1);
      std::vector<std::vector<int32_t>> history{std::vector<int32_t>(70), std::vector<int32_t>(5),
                                                std::vector<int32_t>(140)};
      for (auto& h : history) {
        for (int32_t& t : h) t = token(generator);
      }
      const uint32_t vocab = config.vocab_size;
      std::vector<float> got(kSequences * uint64_t{vocab}), want(vocab);
      std::vector<int32_t> argmax(kSequences);
      std::vector<transformer::SequenceSlots::Run> runs;
      for (uint32_t s = 0; s < kSequences; s++) runs.push_back({s, history[s], 0});
      ASSERT_TRUE(slots.Step(runs, got, argmax).ok());
      for (uint32_t s = 0; s < kSequences; s++) {
        ASSERT_TRUE(transformer::CpuSequence(model, *caches[s]).Forward(history[s], 0, want).ok());
        EXPECT_LE(WorstError({got.begin() + s * vocab, got.begin() + (s + 1) * vocab}, want), Tolerance(dtype))
            << "prompt of sequence " << s;
      }
      for (uint32_t round = 0; round < 3; round++) {
        std::vector<int32_t> next(kSequences);
        runs.clear();
        for (uint32_t s = 0; s < kSequences; s++) {
          next[s] = token(generator);
          runs.push_back({s, {&next[s], 1}, static_cast<uint32_t>(history[s].size()), s == 1});
        }
        ASSERT_TRUE(slots.Step(runs, got, argmax).ok());
        for (uint32_t s = 0; s < kSequences; s++) {
          transformer::CpuSequence cpu(model, *caches[s]);
          ASSERT_TRUE(cpu.Forward({&next[s], 1}, static_cast<uint32_t>(history[s].size()), want).ok());
          history[s].push_back(next[s]);
          if (s == 1) {
            // The device's choice is the CPU's best within the dtype's rounding (two close logits
            // may swap in 16 bits).
            ASSERT_GE(argmax[s], 0);
            double scale = 1;
            for (float w : want) scale = std::max(scale, double{std::fabs(w)});
            const float best = want[*transformer::ArgMaxToken(want)];
            EXPECT_LE(best - want[argmax[s]], dtype == DType::F32 ? 0.0 : Tolerance(dtype) * scale)
                << "the argmax on the device, round " << round;
          } else {
            EXPECT_LE(WorstError({got.begin() + s * vocab, got.begin() + (s + 1) * vocab}, want), Tolerance(dtype))
                << "decode round " << round << " of sequence " << s;
          }
        }
      }
      // Sequence 2's first two blocks are published: a new prompt that begins the same way takes them.
      slots.Free(2);
      std::vector<int32_t> longer(history[2].begin(), history[2].begin() + 130);
      const uint32_t reused = slots.Reuse(2, longer, nullptr);
      EXPECT_EQ(reused, 128u);
      runs = {{2, {longer.data() + reused, longer.size() - reused}, reused}};
      ASSERT_TRUE(slots.Step(runs, got, argmax).ok());
      transformer::KvCache fresh(config, kContext);
      ASSERT_TRUE(transformer::CpuSequence(model, fresh).Forward(longer, 0, want).ok());
      EXPECT_LE(WorstError({got.begin(), got.begin() + vocab}, want), Tolerance(dtype)) << "after a reused prefix";
      // Slot 1 takes the same prefix while slot 2 holds it, then rewrites positions 100 on: the
      // shared second block is copied on the device first, and both go on as the CPU does.
      slots.Free(1);
      ASSERT_EQ(slots.Reuse(1, longer, nullptr), 128u);
      runs = {{1, {longer.data() + 100, 30}, 100}};
      ASSERT_TRUE(slots.Step(runs, got, argmax).ok());
      EXPECT_LE(WorstError({got.begin(), got.begin() + vocab}, want), Tolerance(dtype)) << "over a copied block";
      const int32_t after = token(generator);
      runs = {{2, {&after, 1}, 130}};
      ASSERT_TRUE(slots.Step(runs, got, argmax).ok());
      ASSERT_TRUE(transformer::CpuSequence(model, fresh).Forward({&after, 1}, 130, want).ok());
      EXPECT_LE(WorstError({got.begin(), got.begin() + vocab}, want), Tolerance(dtype)) << "the other holder's blocks";
    }
  }
}

}  // namespace
}  // namespace warmpool::testing
