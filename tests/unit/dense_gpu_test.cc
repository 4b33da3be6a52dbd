// The dense engine on CUDA device memory, against the naive double-precision reference, for every
// weight dtype and activation, within each dtype's tolerance (f16 and bf16 layers multiply
// activations narrowed to their type). The device memory service is the worker's (CudaMemory),
// its grants made in this process by an allocation of device 0.
//
// On a GPU (scripts/gpu-check.sh) the layers must run there, with cuBLAS: the test fails when the
// GPU kernels do not start. Against the driver test double they cannot (the CUDA runtime finds no
// driver it can use); the engine must then say why and compute on the CPU, with the same results.
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "engines/builtin.h"
#include "engines/catalog/builtin_engines.h"
#include "engines/dense_gpu.h"
#include "engines/dense_model.h"
#include "tests/unit/cuda_device_fixture.h"
#include "tests/unit/dense_reference.h"

namespace warmpool::testing {
namespace {

class DenseGpuTest : public CudaMemoryTest {
 protected:
  // Loads the model into device memory and checks its answers for a few batch sizes.
  void ExpectMatchesReference(const std::string& path, const ReferenceModel& model, double relative,
                              double absolute, const std::string& context) {
    Result<Engine> engine = Engine::Open(FindBuiltinEngine("dense"), Spec(path), memory_->service());
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    ASSERT_TRUE(engine->Load().ok());
    const auto cols = static_cast<uint32_t>(model.layers.front().spec.in);
    std::mt19937 generator(42);
    for (uint32_t rows : {1u, 7u, 64u, 300u}) {
      std::vector<float> input = RandomValues(size_t{rows} * cols, 1.0, generator);
      std::vector<float> output;
      Status status = engine->Infer(input, rows, cols, output);
      ASSERT_TRUE(status.ok()) << status.ToString();
      ExpectClose(output, ReferenceForward(model, input, rows), relative, absolute,
                  fmt::format("{} rows {}", context, rows));
    }
  }

};

// Tolerances: f32 as the CPU engine (no TF32 unless configured); 16-bit activations carry 11 (f16)
// or 8 (bf16) significant bits into each product.
double Relative(DType dtype) { return dtype == DType::F32 ? 1e-4 : dtype == DType::F16 ? 1e-2 : 3e-2; }
double Absolute(DType dtype) { return dtype == DType::F32 ? 1e-5 : dtype == DType::F16 ? 1e-2 : 3e-2; }

TEST_F(DenseGpuTest, EveryDTypeAndActivationMatchesTheReference) {
  TempDir dir;
  for (DType dtype : {DType::F32, DType::F16, DType::BF16}) {
    for (const char* activation : {"relu", "gelu", "tanh", "none"}) {
      // A layer without bias among them (no epilogue bias), and a batch above kMaxBatch (steps).
      std::vector<LayerSpec> specs = {{0, 64, 300}, {2, 300, 40, false}, {4, 40, 10}};
      for (LayerSpec& spec : specs) spec.weight_dtype = spec.bias_dtype = dtype;
      const std::string path = dir.File(fmt::format("{}_{}.safetensors", DTypeName(dtype), activation));
      ReferenceModel model = WriteModel(path, specs, activation, 5);
      ExpectMatchesReference(path, model, Relative(dtype), Absolute(dtype),
                             fmt::format("{} {}", DTypeName(dtype), activation));
    }
  }
}

TEST_F(DenseGpuTest, MixedDTypesAndAMisalignedWeight) {
  TempDir dir;
  const std::string path = dir.File("mixed.safetensors");
  // An f16 bias of odd length written first leaves the f32 weight after it off 4-byte alignment:
  // cuBLAS cannot take it, so that model computes on the CPU (and says why), correctly.
  ReferenceModel model = WriteModel(path,
                                    {{0, 12, 9, true, DType::F32, DType::F16},
                                     {2, 9, 7, true, DType::BF16, DType::F32},
                                     {4, 7, 5, true, DType::F16, DType::BF16}},
                                    "gelu", 7, /*bias_first=*/true);
  ExpectMatchesReference(path, model, 3e-2, 3e-2, "mixed");
}

// 16-bit weights packed without padding (safetensors has none): a bias of odd length written before
// its weight leaves the weight 2 bytes past an alignment cuBLASLt would otherwise assume (and fault
// on), with `in` a multiple of 8 so that nothing else steers it away from vectorized kernels.
TEST_F(DenseGpuTest, SixteenBitWeightsAtAnyEvenOffset) {
  TempDir dir;
  for (DType dtype : {DType::F16, DType::BF16}) {
    const std::string path = dir.File(fmt::format("packed_{}.safetensors", DTypeName(dtype)));
    ReferenceModel model = WriteModel(path,
                                      {{0, 64, 33, true, dtype, dtype},
                                       {2, 33, 24, true, dtype, dtype},
                                       {4, 24, 8, true, dtype, dtype}},
                                      "relu", 11, /*bias_first=*/true);
    ExpectMatchesReference(path, model, Relative(dtype), Absolute(dtype), fmt::format("packed {}", DTypeName(dtype)));
  }
}

// Rows with a NaN, +Inf or -Inf among ordinary ones, for every activation: on a GPU the activation
// runs in engines/cuda's kernel (not cuBLASLt's ReLU epilogue, which does not promise to keep NaN),
// and the non-finite rows must come out non-finite as the reference says, the others unaffected.
// Infinities stay infinities when the activations are narrowed to f16 or bf16.
TEST_F(DenseGpuTest, NonFiniteRowsStayNonFiniteAndTheOthersAreUnaffected) {
  TempDir dir;
  for (DType dtype : {DType::F32, DType::F16, DType::BF16}) {
    for (const char* activation : {"relu", "gelu", "tanh", "none"}) {
      std::vector<LayerSpec> specs = {{0, 64, 48}, {2, 48, 40, false}, {4, 40, 10}};
      for (LayerSpec& spec : specs) spec.weight_dtype = spec.bias_dtype = dtype;
      const std::string path = dir.File(fmt::format("nonfinite_{}_{}.safetensors", DTypeName(dtype), activation));
      ReferenceModel model = WriteModel(path, specs, activation, 13);
      Result<Engine> engine = Engine::Open(FindBuiltinEngine("dense"), Spec(path), memory_->service());
      ASSERT_TRUE(engine.ok()) << engine.status().ToString();
      ASSERT_TRUE(engine->Load().ok());
      std::mt19937 generator(59);
      for (uint32_t rows : {1u, 4u, 7u, 64u}) {
        std::vector<float> input = RandomValues(size_t{rows} * 64, 1.0, generator);
        const float specials[] = {NAN, INFINITY, -INFINITY};
        for (uint32_t r = 0; r < rows; r += 2) input[size_t{r} * 64 + (r * 7) % 64] = specials[(r / 2) % 3];
        std::vector<float> output;
        ASSERT_TRUE(engine->Infer(input, rows, 64, output).ok());
        ExpectClose(output, ReferenceForward(model, input, rows), Relative(dtype), Absolute(dtype),
                    fmt::format("{} {} rows {}", DTypeName(dtype), activation, rows));
      }
    }
  }
}

// Whether the layers run on the GPU at all: on a GPU they must; on the double they cannot, and the
// reason says so.
TEST_F(DenseGpuTest, TheGpuKernelsStartOnAGpuAndSayWhyNotElsewhere) {
  TempDir dir;
  const std::string path = dir.File("m.safetensors");
  WriteModel(path, {{0, 32, 64}, {2, 64, 8}}, "relu", 3);
  Result<safetensors::Header> header = safetensors::ReadHeader(path);
  ASSERT_TRUE(header.ok());
  Result<dense::DenseModel> model = dense::DescribeModel(*header, path);
  ASSERT_TRUE(model.ok());
  const wp_device_memory* service = memory_->service();
  wp_region weights{};
  ASSERT_EQ(service->alloc(service->ctx, header->data_bytes, &weights), WP_OK);
  std::string why;
  std::unique_ptr<dense::GpuRunner> runner = dense::StartGpuRunner(*model, service, weights, &why);
  if (on_the_double_) {
    EXPECT_EQ(runner, nullptr);
    EXPECT_FALSE(why.empty()) << "a runner that does not start says why";
  } else {
    ASSERT_NE(runner, nullptr) << "the GPU kernels did not start: " << why;
    EXPECT_NE(runner->Describe().find("cuBLAS"), std::string::npos) << runner->Describe();
    std::vector<float> input(32, 0.5f), output(8, -1.0f);
    EXPECT_TRUE(runner->Run(input.data(), 1, output.data()).ok());
    runner.reset();
  }
  service->free(service->ctx, &weights);
}

}  // namespace
}  // namespace warmpool::testing
