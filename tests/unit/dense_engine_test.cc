#include <cmath>
#include <sys/mman.h>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <unistd.h>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "devmem/host_memory.h"
#include "engines/builtin.h"
#include "engines/catalog/builtin_engines.h"
#include "engines/bf16_gemv.h"
#include "engines/dense_cpu.h"
#include "engines/gemv.h"
#include "engines/half.h"
#include "engines/safetensors.h"
#include "tests/unit/dense_reference.h"

namespace warmpool {
namespace safetensors {
void PrintTo(DType dtype, std::ostream* out) { *out << DTypeName(dtype); }
}  // namespace safetensors

namespace {

using safetensors::DType;
using safetensors::TensorToWrite;
using namespace warmpool::testing;

Result<Engine> OpenDense(const std::string& path, HostMemory& memory) {
  return Engine::Open(FindBuiltinEngine("dense"), Spec(path), memory.service());
}

// Opens and expects an INVALID_ARGUMENT naming the problem.
void ExpectOpenFails(const std::string& path, const std::string& substring, Code code = Code::kInvalidArgument) {
  HostMemory memory;
  Result<Engine> engine = OpenDense(path, memory);
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), code) << engine.status().ToString();
  EXPECT_NE(engine.status().message().find(substring), std::string::npos) << engine.status().message();
}

// ---- numerics against the reference: every dtype x activation ----

class DenseNumerics : public ::testing::TestWithParam<std::tuple<DType, std::string>> {};

TEST_P(DenseNumerics, MatchesNaiveReference) {
  const auto& [dtype, activation] = GetParam();
  const std::vector<std::vector<LayerSpec>> configs = {
      {{0, 8, 4}},
      {{0, 16, 32}, {2, 32, 8}},
      {{0, 5, 7, false}, {1, 7, 9}, {2, 9, 3, false}, {3, 3, 2}},
      // Indices past 9 prove layers are ordered numerically, not as strings.
      {{0, 6, 5}, {2, 5, 4}, {4, 4, 3}, {6, 3, 4}, {8, 4, 5}, {10, 5, 2}},
      {{0, 64, 300}, {2, 300, 10}},
  };
  TempDir dir;
  for (size_t c = 0; c < configs.size(); ++c) {
    std::vector<LayerSpec> specs = configs[c];
    for (LayerSpec& spec : specs) spec.weight_dtype = spec.bias_dtype = dtype;
    const std::string path = dir.File(fmt::format("model{}.safetensors", c));
    ReferenceModel model = WriteModel(path, specs, activation, static_cast<unsigned>(c + 1));
    HostMemory memory;
    Result<Engine> engine = OpenDense(path, memory);
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    ASSERT_TRUE(engine->Load().ok());
    EXPECT_EQ(engine->info().in_features, specs.front().in);
    EXPECT_EQ(engine->info().out_features, specs.back().out);

    std::mt19937 generator(42);
    for (uint32_t rows : {1u, 7u, 64u}) {
      const auto cols = static_cast<uint32_t>(specs.front().in);
      std::vector<float> input = RandomValues(size_t{rows} * cols, 1.0, generator);
      std::vector<float> output;
      Status status = engine->Infer(input, rows, cols, output);
      ASSERT_TRUE(status.ok()) << status.ToString();
      ExpectCpuClose(output, model, input, rows,
                     fmt::format("{} {} config {} rows {}", safetensors::DTypeName(dtype), activation, c, rows));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllDTypesAndActivations, DenseNumerics,
                         ::testing::Combine(::testing::Values(DType::F32, DType::F16, DType::BF16),
                                            ::testing::Values("relu", "gelu", "tanh", "none")),
                         [](const auto& info) {
                           return fmt::format("{}_{}", safetensors::DTypeName(std::get<0>(info.param)),
                                              std::get<1>(info.param));
                         });

// Every dtype for weights and biases, 12 -> 9 -> 7 -> 5 with gelu. Each f16 bias of odd length
// written first leaves the f32 weight after it off 4-byte alignment.
ReferenceModel WriteMixedModel(const std::string& path) {
  return WriteModel(path,
                    {{0, 12, 9, true, DType::F32, DType::F16},
                     {2, 9, 7, true, DType::BF16, DType::F32},
                     {4, 7, 5, true, DType::F16, DType::BF16}},
                    "gelu", 7, /*bias_first=*/true);
}

TEST(DenseEngine, MixedDTypesAndMisalignedF32) {
  TempDir dir;
  const std::string path = dir.File("mixed.safetensors");
  ReferenceModel model = WriteMixedModel(path);
  HostMemory memory;
  Result<Engine> engine = OpenDense(path, memory);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  ASSERT_TRUE(engine->Load().ok());
  std::mt19937 generator(3);
  std::vector<float> input = RandomValues(7 * 12, 1.0, generator);
  std::vector<float> output;
  ASSERT_TRUE(engine->Infer(input, 7, 12, output).ok());
  ExpectCpuClose(output, model, input, 7, "mixed");
}

// Every path of the CPU layers: the f16 kernel for 1..kGemvRows rows (in passes of up to 8 rows,
// over blocks of outputs, with inputs that are not a multiple of its vector width) and the widened
// matmul above it; bf16 and f32 matmuls at each batch size; one and two threads.
TEST(DenseEngine, EveryBatchSizeAndThreadCountOnEveryPath) {
  TempDir dir;
  for (DType dtype : {DType::F16, DType::BF16, DType::F32}) {
    const std::string path = dir.File(fmt::format("{}.safetensors", safetensors::DTypeName(dtype)));
    // 4099 inputs: 31 outputs per block of the f16 kernel, so 70 outputs make three blocks.
    ReferenceModel model = WriteModel(path, {{0, 4099, 70, true, dtype, dtype}, {2, 70, 13, false, dtype, dtype}}, "gelu", 9);
    for (int threads : {1, 2}) {
      dense::SetCpuThreads(threads);
      HostMemory memory;
      Result<Engine> engine = OpenDense(path, memory);
      ASSERT_TRUE(engine.ok()) << engine.status().ToString();
      ASSERT_TRUE(engine->Load().ok());
      std::mt19937 generator(11);
      for (uint32_t rows : {1u, 2u, 3u, 4u, 5u, 8u, 9u, 15u, 16u, 17u, 33u}) {
        std::vector<float> input = RandomValues(size_t{rows} * 4099, 1.0, generator);
        std::vector<float> output;
        ASSERT_TRUE(engine->Infer(input, rows, 4099, output).ok());
        ExpectCpuClose(output, model, input, rows,
                       fmt::format("{} threads {} rows {}", safetensors::DTypeName(dtype), threads, rows));
      }
    }
  }
  dense::SetCpuThreads(1);
}

// The f16 kernel on each instruction set this CPU has, against a double-precision product: every
// row count a pass takes, outputs not a multiple of four, inputs not a multiple of the vector.
TEST(F16Gemv, EveryInstructionSetMatchesTheProduct) {
  std::mt19937 generator(13);
  int tried = 0;
  // 31 outputs per block: three blocks, the last of 8; tails of one and of two vectors.
  for (uint32_t in : {4099u, 4117u}) {
    const uint32_t out = 70;
    std::vector<float> weights = RandomValues(size_t{in} * out, 0.05, generator);
    std::vector<uint16_t> halves(weights.size());
    for (size_t i = 0; i < weights.size(); ++i) halves[i] = safetensors::FloatToHalf(weights[i]);
    std::vector<float> bias = RandomValues(out, 0.5, generator);
    for (dense::F16Isa isa : {dense::F16Isa::kAvx2, dense::F16Isa::kAvx512}) {
      if (!dense::HaveF16Isa(isa)) continue;
      ++tried;
      for (uint32_t rows : {1u, 2u, 3u, 4u, 5u, 7u, 8u, 9u, 16u}) {
        std::vector<float> x = RandomValues(size_t{rows} * in, 1.0, generator);
        std::vector<float> y(size_t{rows} * out);
        dense::F16GemvOn(isa, reinterpret_cast<const uint8_t*>(halves.data()), in, out, x.data(), rows, bias.data(),
                         y.data(), 2);
        for (uint32_t r = 0; r < rows; ++r) {
          for (uint32_t n = 0; n < out; ++n) {
            double want = bias[n];
            for (uint32_t k = 0; k < in; ++k) want += double{safetensors::HalfToFloat(halves[size_t{n} * in + k])} * x[size_t{r} * in + k];
            ASSERT_NEAR(y[size_t{r} * out + n], want, 1e-4 + 1e-4 * std::fabs(want))
                << "isa " << static_cast<int>(isa) << " in " << in << " rows " << rows << " row " << r << " output " << n;
          }
        }
      }
    }
  }
  if (tried == 0) GTEST_SKIP() << "this CPU has neither AVX2 nor AVX-512F with F16C";
}

// The f32 kernel against a double-precision product: every row count a pass takes, outputs not a
// multiple of four, inputs with tails of one and of two vectors, weights at an odd address.
TEST(F32Gemv, MatchesTheProduct) {
  if (!dense::HaveF32Gemv()) GTEST_SKIP() << "this CPU has no AVX-512F";
  std::mt19937 generator(19);
  for (uint32_t in : {4099u, 4117u}) {
    const uint32_t out = 70;
    std::vector<float> weights = RandomValues(size_t{in} * out, 0.05, generator);
    std::vector<uint8_t> stored(weights.size() * 4 + 1);
    std::memcpy(stored.data() + 1, weights.data(), weights.size() * 4);
    std::vector<float> bias = RandomValues(out, 0.5, generator);
    for (uint32_t rows : {1u, 2u, 3u, 4u, 5u, 9u}) {
      std::vector<float> x = RandomValues(size_t{rows} * in, 1.0, generator);
      std::vector<float> y(size_t{rows} * out);
      dense::F32Gemv(stored.data() + 1, in, out, x.data(), rows, bias.data(), y.data(), 2);
      for (uint32_t r = 0; r < rows; ++r) {
        for (uint32_t n = 0; n < out; ++n) {
          double want = bias[n];
          for (uint32_t k = 0; k < in; ++k) want += double{weights[size_t{n} * in + k]} * x[size_t{r} * in + k];
          ASSERT_NEAR(y[size_t{r} * out + n], want, 1e-4 + 1e-4 * std::fabs(want))
              << "in " << in << " rows " << rows << " row " << r << " output " << n;
        }
      }
    }
  }
}

// The bf16 kernel against a double-precision product of the same bf16 weights and inputs: every
// row count a pass takes, outputs not a multiple of four, inputs with a tail shorter than a vector,
// weights at an odd address (safetensors packs tensors without padding).
TEST(BF16Gemv, MatchesTheProductOfTheNarrowedValues) {
  if (!dense::HaveBF16Gemv()) GTEST_SKIP() << "this CPU has no AVX-512 BF16";
  std::mt19937 generator(17);
  const uint32_t in = 4099, out = 70;
  std::vector<float> weights = RandomValues(size_t{in} * out, 0.05, generator);
  std::vector<uint8_t> stored(weights.size() * 2 + 1);
  uint8_t* w = stored.data() + 1;
  for (size_t i = 0; i < weights.size(); ++i) {
    const uint16_t bits = safetensors::FloatToBF16(weights[i]);
    std::memcpy(w + 2 * i, &bits, 2);
  }
  auto weight_at = [&](size_t i) {
    uint16_t bits;
    std::memcpy(&bits, w + 2 * i, 2);
    return double{safetensors::BF16ToFloat(bits)};
  };
  std::vector<float> bias = RandomValues(out, 0.5, generator);
  for (uint32_t rows : {1u, 2u, 3u, 4u, 5u, 6u, 7u, 8u, 9u, 12u, 16u}) {
    std::vector<float> values = RandomValues(size_t{rows} * in, 1.0, generator);
    std::vector<uint16_t> x(values.size());
    for (size_t i = 0; i < values.size(); ++i) x[i] = safetensors::FloatToBF16(values[i]);
    for (bool with_bias : {true, false}) {
      std::vector<float> y(size_t{rows} * out);
      dense::BF16Gemv(w, in, out, x.data(), rows, with_bias ? bias.data() : nullptr, y.data(), 2);
      for (uint32_t r = 0; r < rows; ++r) {
        for (uint32_t n = 0; n < out; ++n) {
          double want = with_bias ? bias[n] : 0.0;
          for (uint32_t k = 0; k < in; ++k) {
            want += weight_at(size_t{n} * in + k) * safetensors::BF16ToFloat(x[size_t{r} * in + k]);
          }
          ASSERT_NEAR(y[size_t{r} * out + n], want, 1e-4 + 1e-4 * std::fabs(want))
              << "rows " << rows << " row " << r << " output " << n << " bias " << with_bias;
        }
      }
    }
  }
}

TEST(DenseEngine, BatchLargerThanMaxBatchIsProcessedInSteps) {
  TempDir dir;
  const std::string path = dir.File("steps.safetensors");
  ReferenceModel model = WriteModel(path, {{0, 10, 20}, {2, 20, 3}}, "tanh");
  HostMemory memory;
  Result<Engine> engine = OpenDense(path, memory);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  ASSERT_TRUE(engine->Load().ok());
  const uint32_t rows = engine->info().max_batch * 2 + 13;
  std::mt19937 generator(5);
  std::vector<float> input = RandomValues(size_t{rows} * 10, 1.0, generator);
  std::vector<float> output;
  ASSERT_TRUE(engine->Infer(input, rows, 10, output).ok());
  ExpectCpuClose(output, model, input, rows, "stepped");
}

TEST(DenseEngine, InfoReportsSizesFromTheHeader) {
  TempDir dir;
  const std::string path = dir.File("info.safetensors");
  WriteModel(path, {{0, 16, 32, true, DType::F16, DType::F16}, {2, 32, 8, true, DType::F32, DType::F32}}, "relu");
  HostMemory memory;
  Result<Engine> engine = OpenDense(path, memory);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  const wp_engine_info& info = engine->info();
  EXPECT_EQ(info.weight_bytes, (32u * 16 + 32) * 2 + (8u * 32 + 8) * 4);
  EXPECT_EQ(info.max_batch, 256u);
  // Two activation buffers of max_batch x 32 hidden floats, the f16 weight widened to f32 (for
  // batches above the f16 kernel's) and both biases as f32.
  EXPECT_EQ(info.workspace_bytes, (2u * 256 * 32 + 32 * 16 + (32 + 8)) * 4);
  EXPECT_EQ(info.in_features, 16u);
  EXPECT_EQ(info.out_features, 8u);
  EXPECT_EQ(memory.used_bytes(), 0u) << "open reads no weights";
  ASSERT_TRUE(engine->Load().ok());
  EXPECT_EQ(memory.used_bytes(), info.weight_bytes) << "one region of weight_bytes";
}

TEST(DenseEngine, RegionIsFreedOnClose) {
  TempDir dir;
  const std::string path = dir.File("close.safetensors");
  WriteModel(path, {{0, 4, 4}}, "relu");
  HostMemory memory;
  {
    Result<Engine> engine = OpenDense(path, memory);
    ASSERT_TRUE(engine.ok());
    ASSERT_TRUE(engine->Load().ok());
    EXPECT_GT(memory.used_bytes(), 0u);
  }
  EXPECT_EQ(memory.used_bytes(), 0u);
}

// ---- inputs that are wrong ----

TEST(DenseEngine, WrongInputWidthIsInvalidArgument) {
  TempDir dir;
  const std::string path = dir.File("width.safetensors");
  WriteModel(path, {{0, 4, 3}}, "relu");
  HostMemory memory;
  Result<Engine> engine = Engine::Open(FindBuiltinEngine("dense"), Spec(path, "classifier"), memory.service());
  ASSERT_TRUE(engine.ok());
  ASSERT_TRUE(engine->Load().ok());
  std::vector<float> input(10, 1.0f);
  std::vector<float> output;
  Status status = engine->Infer(input, 2, 5, output);
  EXPECT_EQ(status.code(), Code::kInvalidArgument);
  EXPECT_EQ(status.message(), "input has 5 columns but model \"classifier\" expects 4");
}

TEST(DenseEngine, ZeroRowsIsInvalidArgument) {
  TempDir dir;
  const std::string path = dir.File("rows.safetensors");
  WriteModel(path, {{0, 4, 3}}, "relu");
  HostMemory memory;
  Result<Engine> engine = OpenDense(path, memory);
  ASSERT_TRUE(engine.ok());
  ASSERT_TRUE(engine->Load().ok());
  std::vector<float> output;
  EXPECT_EQ(engine->Infer({}, 0, 4, output).code(), Code::kInvalidArgument);
}

TEST(DenseEngine, InferBeforeLoadAndLoadTwiceAreRefused) {
  TempDir dir;
  const std::string path = dir.File("order.safetensors");
  WriteModel(path, {{0, 4, 3}}, "relu");
  HostMemory memory;
  Result<Engine> engine = OpenDense(path, memory);
  ASSERT_TRUE(engine.ok());
  std::vector<float> input(4, 1.0f);
  std::vector<float> output;
  EXPECT_EQ(engine->Infer(input, 1, 4, output).code(), Code::kFailedPrecondition);
  ASSERT_TRUE(engine->Load().ok());
  EXPECT_EQ(engine->Load().code(), Code::kFailedPrecondition);
}

// ---- models that are wrong ----

TEST(DenseModelErrors, LayersDoNotChain) {
  TempDir dir;
  WriteModel(dir.File("m"), {{0, 4, 6}, {2, 5, 3}}, "relu");
  ExpectOpenFails(dir.File("m"), "layers do not chain: \"0.weight\" produces 6 features but \"2.weight\" (shape [3, 5]) takes 5");
}

TEST(DenseModelErrors, TensorNameNotALayer) {
  TempDir dir;
  ASSERT_TRUE(safetensors::WriteFile(dir.File("m"), {{"encoder.weight", DType::F32, {1, 1}, std::vector<uint8_t>(4)}}, {}).ok());
  ExpectOpenFails(dir.File("m"), "tensor \"encoder.weight\" is not named <index>.weight or <index>.bias");
}

TEST(DenseModelErrors, TensorKindNotWeightOrBias) {
  TempDir dir;
  ASSERT_TRUE(safetensors::WriteFile(dir.File("m"), {{"0.weight", DType::F32, {1, 1}, std::vector<uint8_t>(4)},
                                                     {"1.running_mean", DType::F32, {1}, std::vector<uint8_t>(4)}}, {}).ok());
  ExpectOpenFails(dir.File("m"), "tensor \"1.running_mean\" is not named");
}

TEST(DenseModelErrors, LeadingZeroIndexIsRejected) {
  TempDir dir;
  ASSERT_TRUE(safetensors::WriteFile(dir.File("m"), {{"00.weight", DType::F32, {1, 1}, std::vector<uint8_t>(4)}}, {}).ok());
  ExpectOpenFails(dir.File("m"), "tensor \"00.weight\" is not named");
}

TEST(DenseModelErrors, BiasWithoutWeight) {
  TempDir dir;
  ASSERT_TRUE(safetensors::WriteFile(dir.File("m"), {{"0.weight", DType::F32, {1, 1}, std::vector<uint8_t>(4)},
                                                     {"2.bias", DType::F32, {1}, std::vector<uint8_t>(4)}}, {}).ok());
  ExpectOpenFails(dir.File("m"), "tensor \"2.bias\" has no matching \"2.weight\"");
}

TEST(DenseModelErrors, BiasOfWrongLength) {
  TempDir dir;
  ASSERT_TRUE(safetensors::WriteFile(dir.File("m"), {{"0.weight", DType::F32, {2, 1}, std::vector<uint8_t>(8)},
                                                     {"0.bias", DType::F32, {3}, std::vector<uint8_t>(12)}}, {}).ok());
  ExpectOpenFails(dir.File("m"), "tensor \"0.bias\" has shape [3] but \"0.weight\" has 2 output features");
}

TEST(DenseModelErrors, WeightNotTwoDimensional) {
  TempDir dir;
  ASSERT_TRUE(safetensors::WriteFile(dir.File("m"), {{"0.weight", DType::F32, {2, 1, 1}, std::vector<uint8_t>(8)}}, {}).ok());
  ExpectOpenFails(dir.File("m"), "tensor \"0.weight\" has shape [2, 1, 1]; a Linear weight is [out_features, in_features]");
}

TEST(DenseModelErrors, ZeroSizedWeight) {
  TempDir dir;
  ASSERT_TRUE(safetensors::WriteFile(dir.File("m"), {{"0.weight", DType::F32, {0, 3}, {}}}, {}).ok());
  ExpectOpenFails(dir.File("m"), "each dimension must be between 1");
}

TEST(DenseModelErrors, UnknownActivation) {
  TempDir dir;
  ASSERT_TRUE(safetensors::WriteFile(dir.File("m"), {{"0.weight", DType::F32, {1, 1}, std::vector<uint8_t>(4)}},
                                     {{"activation", "swish"}}).ok());
  ExpectOpenFails(dir.File("m"), "unknown activation \"swish\"");
}

TEST(DenseModelErrors, UnsupportedDType) {
  TempDir dir;
  ASSERT_TRUE(safetensors::WriteFile(dir.File("m"), {{"0.weight", DType::I32, {1, 1}, std::vector<uint8_t>(4)}}, {}).ok());
  ExpectOpenFails(dir.File("m"), "tensor \"0.weight\" has dtype I32; the dense engine supports F32, F16 and BF16");
}

TEST(DenseModelErrors, MetadataNamesAnotherEngine) {
  TempDir dir;
  ASSERT_TRUE(safetensors::WriteFile(dir.File("m"), {{"0.weight", DType::F32, {1, 1}, std::vector<uint8_t>(4)}},
                                     {{"engine", "llama"}}).ok());
  ExpectOpenFails(dir.File("m"), "names engine \"llama\", not \"dense\"");
}

TEST(DenseModelErrors, NoLayers) {
  TempDir dir;
  ASSERT_TRUE(safetensors::WriteFile(dir.File("m"), {}, {{"activation", "relu"}}).ok());
  ExpectOpenFails(dir.File("m"), "no layers");
}

TEST(DenseModelErrors, MalformedFileIsReportedByTheParser) {
  TempDir dir;
  std::ofstream(dir.File("m")) << "not a model";
  ExpectOpenFails(dir.File("m"), "model file \"" + dir.File("m") + "\"");
}

TEST(DenseModelErrors, MissingFileIsNotFound) {
  ExpectOpenFails("/nonexistent/model.safetensors", "cannot open", Code::kNotFound);
}

TEST(DenseModelErrors, EmptyPathIsInvalid) { ExpectOpenFails("", "needs a model file"); }

TEST(DenseModelErrors, DeviceMemoryWithoutCopiesIsRefused) {
  TempDir dir;
  WriteModel(dir.File("m"), {{0, 2, 2}}, "relu");
  HostMemory memory;
  wp_device_memory device = *memory.service();
  device.host_addressable = 0;
  device.write = nullptr;
  device.read = nullptr;
  Result<Engine> engine = Engine::Open(FindBuiltinEngine("dense"), Spec(dir.File("m")), &device);
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), Code::kFailedPrecondition);
}

// Device memory as the cuda backend hands it out: pointers the CPU must not touch (each stands
// for a PROT_NONE range, so a direct access crashes the test), reached only through write/read.
class OpaqueDevice {
 public:
  OpaqueDevice() : service_{this, &Alloc, &Free, 0, &Import, &Write, &Read} {}
  const wp_device_memory* service() { return &service_; }

 private:
  static wp_status Alloc(void* ctx, uint64_t bytes, wp_region* out) {
    auto* self = static_cast<OpaqueDevice*>(ctx);
    Result<HostRegion> real = self->host_.Allocate(bytes, "opaque");
    if (!real.ok()) return WP_RESOURCE_EXHAUSTED;
    void* opaque = mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    self->regions_[opaque] = *real;
    *out = wp_region{opaque, bytes, real->fd};
    return WP_OK;
  }
  static void Free(void* ctx, wp_region* region) {
    auto* self = static_cast<OpaqueDevice*>(ctx);
    auto it = self->regions_.find(region->ptr);
    if (it == self->regions_.end()) return;
    munmap(region->ptr, region->bytes);
    self->host_.Free(it->second);
    self->regions_.erase(it);
    *region = wp_region{nullptr, 0, -1};
  }
  static wp_status Import(void*, int, uint64_t, wp_region*) { return WP_INTERNAL; }
  static uint8_t* Real(void* ctx, const wp_region* region, uint64_t offset, uint64_t bytes) {
    auto* self = static_cast<OpaqueDevice*>(ctx);
    auto it = self->regions_.find(region->ptr);
    if (it == self->regions_.end() || offset + bytes > it->second.bytes) return nullptr;
    return static_cast<uint8_t*>(it->second.ptr) + offset;
  }
  static wp_status Write(void* ctx, const wp_region* region, uint64_t offset, const void* source, uint64_t bytes) {
    uint8_t* real = Real(ctx, region, offset, bytes);
    if (real == nullptr) return WP_INVALID_ARGUMENT;
    std::memcpy(real, source, bytes);
    return WP_OK;
  }
  static wp_status Read(void* ctx, const wp_region* region, uint64_t offset, void* destination, uint64_t bytes) {
    uint8_t* real = Real(ctx, region, offset, bytes);
    if (real == nullptr) return WP_INVALID_ARGUMENT;
    std::memcpy(destination, real, bytes);
    return WP_OK;
  }

  HostMemory host_;
  std::map<void*, HostRegion> regions_;
  wp_device_memory service_;
};

TEST(DenseEngine, DeviceMemoryIsReachedOnlyThroughTheService) {
  TempDir dir;
  const std::string path = dir.File("mixed.safetensors");
  ReferenceModel model = WriteMixedModel(path);
  OpaqueDevice device;
  Result<Engine> engine = Engine::Open(FindBuiltinEngine("dense"), Spec(path), device.service());
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  ASSERT_TRUE(engine->Load().ok());
  std::mt19937 generator(3);
  for (uint32_t rows : {1u, 7u, 300u}) {
    std::vector<float> input = RandomValues(size_t{rows} * 12, 1.0, generator);
    std::vector<float> output;
    Status status = engine->Infer(input, rows, 12, output);
    ASSERT_TRUE(status.ok()) << status.ToString();
    ExpectCpuClose(output, model, input, rows, fmt::format("rows {}", rows));
  }
}

// ---- loading ----

TEST(DenseLoad, FileTruncatedAfterOpen) {
  TempDir dir;
  const std::string path = dir.File("m");
  WriteModel(path, {{0, 32, 32}, {2, 32, 4}}, "relu");
  HostMemory memory;
  Result<Engine> engine = OpenDense(path, memory);
  ASSERT_TRUE(engine.ok());
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 100);
  Status status = engine->Load();
  EXPECT_EQ(status.code(), Code::kFailedPrecondition) << status.ToString();
  EXPECT_NE(status.message().find("changed after it was opened"), std::string::npos) << status.message();
  EXPECT_EQ(memory.used_bytes(), 0u) << "a failed load frees its region";
}

TEST(DenseLoad, FileRemovedAfterOpen) {
  TempDir dir;
  const std::string path = dir.File("m");
  WriteModel(path, {{0, 4, 4}}, "relu");
  HostMemory memory;
  Result<Engine> engine = OpenDense(path, memory);
  ASSERT_TRUE(engine.ok());
  std::filesystem::remove(path);
  EXPECT_EQ(engine->Load().code(), Code::kNotFound);
  EXPECT_EQ(memory.used_bytes(), 0u);
}

TEST(DenseLoad, BudgetExhaustedIsResourceExhausted) {
  TempDir dir;
  const std::string path = dir.File("m");
  WriteModel(path, {{0, 64, 64}}, "relu");
  HostMemory memory(/*budget_bytes=*/1024);
  Result<Engine> engine = OpenDense(path, memory);
  ASSERT_TRUE(engine.ok());
  Status status = engine->Load();
  EXPECT_EQ(status.code(), Code::kResourceExhausted) << status.ToString();
  EXPECT_NE(status.message().find("weights of model \"m\""), std::string::npos) << status.message();
  EXPECT_EQ(memory.used_bytes(), 0u);
}

// Big enough (over 8 MiB) that the weights are read in more than one chunk.
std::string WriteMultiChunkModel(const TempDir& dir) {
  const std::string path = dir.File("big.safetensors");
  WriteModel(path, {{0, 1024, 2100}}, "none");
  return path;
}

TEST(DenseLoad, ProgressReachesTotal) {
  TempDir dir;
  const std::string path = WriteMultiChunkModel(dir);
  HostMemory memory;
  Result<Engine> engine = OpenDense(path, memory);
  ASSERT_TRUE(engine.ok());
  std::vector<std::pair<uint64_t, uint64_t>> calls;
  ASSERT_TRUE(engine->Load([&](uint64_t done, uint64_t total) {
    calls.emplace_back(done, total);
    return true;
  }).ok());
  ASSERT_GE(calls.size(), 2u);
  for (size_t i = 1; i < calls.size(); ++i) EXPECT_GT(calls[i].first, calls[i - 1].first);
  EXPECT_EQ(calls.back().first, engine->info().weight_bytes);
  EXPECT_EQ(calls.back().second, engine->info().weight_bytes);
}

TEST(DenseLoad, CancelStopsTheLoadAndALaterLoadSucceeds) {
  TempDir dir;
  const std::string path = WriteMultiChunkModel(dir);
  HostMemory memory;
  Result<Engine> engine = OpenDense(path, memory);
  ASSERT_TRUE(engine.ok());
  int calls = 0;
  Status cancelled = engine->Load([&](uint64_t, uint64_t) {
    ++calls;
    return false;
  });
  EXPECT_EQ(cancelled.code(), Code::kUnavailable) << cancelled.ToString();
  EXPECT_NE(cancelled.message().find("cancelled"), std::string::npos);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(memory.used_bytes(), 0u);

  ASSERT_TRUE(engine->Load().ok());
  std::vector<float> input(1024, 0.5f);
  std::vector<float> output;
  EXPECT_TRUE(engine->Infer(input, 1, 1024, output).ok());
  EXPECT_EQ(output.size(), 2100u);
}

// ---- the echo engine and the registry ----

TEST(EchoEngine, ReturnsItsInput) {
  HostMemory memory;
  Result<Engine> engine = Engine::Open(FindBuiltinEngine("echo"), SpecForFile("echo", "", nullptr, 0, 0), memory.service());
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  EXPECT_EQ(engine->info().weight_bytes, 0u);
  EXPECT_EQ(engine->info().in_features, 0u);
  EXPECT_EQ(engine->info().out_features, 0u);
  ASSERT_TRUE(engine->Load().ok());
  EXPECT_EQ(memory.used_bytes(), 0u);
  std::vector<float> input = {1, 2, 3, 4, 5, 6};
  std::vector<float> output;
  ASSERT_TRUE(engine->Infer(input, 2, 3, output).ok());
  EXPECT_EQ(output, input);
}

TEST(BuiltinEngines, FindByName) {
  ASSERT_NE(FindBuiltinEngine("dense"), nullptr);
  EXPECT_STREQ(FindBuiltinEngine("dense")->name, "dense");
  EXPECT_EQ(FindBuiltinEngine("dense"), warmpool_engine_dense());
  EXPECT_EQ(FindBuiltinEngine("echo"), warmpool_engine_echo());
  EXPECT_EQ(FindBuiltinEngine("transformer"), warmpool_engine_transformer());
  EXPECT_EQ(FindBuiltinEngine("llama"), nullptr);
}

// An engine built against version 2 of engine.h: its vtable ends at attach, and nothing past it
// may be read (describe, generate), nor its info written past max_batch.
TEST(BuiltinEngines, AVersion2EngineStillLoadsAndServesTensors) {
  struct VtableV2 {
    uint32_t abi_version;
    const char* name;
    decltype(wp_engine_vtable::open) open;
    decltype(wp_engine_vtable::load) load;
    decltype(wp_engine_vtable::infer) infer;
    decltype(wp_engine_vtable::close) close;
    decltype(wp_engine_vtable::export_weights) export_weights;
    decltype(wp_engine_vtable::attach) attach;
  };
  const wp_engine_vtable& echo = *FindBuiltinEngine("echo");
  // On the heap, alone: a read past its end is AddressSanitizer's to see.
  auto v2 = std::make_unique<VtableV2>(
      VtableV2{2, "echo", echo.open, echo.load, echo.infer, echo.close, echo.export_weights, echo.attach});
  HostMemory memory;
  Result<Engine> engine =
      Engine::Open(reinterpret_cast<const wp_engine_vtable*>(v2.get()), SpecForFile("echo", ""), memory.service());
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  EXPECT_FALSE(engine->generates());
  EXPECT_EQ(engine->Describe().status().code(), Code::kNotFound);
  ASSERT_TRUE(engine->Load().ok());
  std::vector<float> input = {1, 2}, output;
  ASSERT_TRUE(engine->Infer(input, 1, 2, output).ok());
  EXPECT_EQ(output, input);
  EXPECT_EQ(engine->Generate(wp_generate_request{}, nullptr).status().code(), Code::kFailedPrecondition);
}

TEST(BuiltinEngines, WrongAbiVersionIsRefused) {
  wp_engine_vtable vtable = *FindBuiltinEngine("echo");
  vtable.abi_version = 99;
  HostMemory memory;
  Result<Engine> engine = Engine::Open(&vtable, SpecForFile("echo", "", nullptr, 0, 0), memory.service());
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), Code::kFailedPrecondition);
}

TEST(BuiltinEngines, ErrorMessagesAreTruncatedSafely) {
  char err[8];
  wp_status status = WpFromStatus(Status(Code::kInvalidArgument, "a long message"), err, sizeof(err));
  EXPECT_EQ(status, WP_INVALID_ARGUMENT);
  EXPECT_STREQ(err, "a long ");
  EXPECT_EQ(StatusFromWp(WP_NOT_FOUND, "gone").code(), Code::kNotFound);
}

// ---- warmpool-mkmodel writes models this engine runs ----

TEST(MkModel, WritesDeterministicModelsTheEngineLoads) {
  const std::string tool = std::string(WARMPOOL_BIN_DIR) + "/warmpool-mkmodel";
  if (!std::filesystem::exists(tool)) GTEST_SKIP() << "build warmpool-mkmodel to run this test";
  TempDir dir;
  for (const char* name : {"a", "b"}) {
    const std::string command = fmt::format("{} {} --layers 8,16,4 --dtype bf16 --activation gelu --seed 9 >/dev/null",
                                            tool, dir.File(name));
    ASSERT_EQ(std::system(command.c_str()), 0) << command;
  }
  auto read = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  EXPECT_EQ(read(dir.File("a")), read(dir.File("b"))) << "the same seed writes the same model";
  EXPECT_EQ(std::system(fmt::format("{} {} --layers 8 2>/dev/null", tool, dir.File("c")).c_str()) >> 8, 2);
  EXPECT_FALSE(std::filesystem::exists(dir.File("c")));

  HostMemory memory;
  Result<Engine> engine = OpenDense(dir.File("a"), memory);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  ASSERT_TRUE(engine->Load().ok());
  std::vector<float> input(8, 0.25f);
  std::vector<float> output;
  ASSERT_TRUE(engine->Infer(input, 1, 8, output).ok());
  EXPECT_EQ(output.size(), 4u);
}

}  // namespace
}  // namespace warmpool
