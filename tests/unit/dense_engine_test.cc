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
#include "engines/dense_cpu.h"
#include "engines/gemv.h"
#include "engines/safetensors.h"
#include "tests/unit/dense_open.h"
#include "tests/unit/dense_reference.h"

namespace warmpool {
namespace safetensors {
void PrintTo(DType dtype, std::ostream* out) { *out << DTypeName(dtype); }
}  // namespace safetensors

namespace {

using safetensors::DType;
using safetensors::TensorToWrite;
using namespace warmpool::testing;

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

// Every path of the CPU layers: the f16 kernel for 1..kGemvRows rows (in passes of up to 4 rows,
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
