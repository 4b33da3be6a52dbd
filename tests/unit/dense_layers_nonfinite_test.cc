// The dense engine's layers on the CPU (every path: the small-batch kernels, the f16 kernel, the
// batched oneDNN matmul) and the engine itself, fed rows with NaN, +-Inf, sums that overflow and
// subnormals, against the double-precision reference (tests/unit/dense_reference.h): a row whose
// math is non-finite gives non-finite outputs, with every activation at its limits, and the other
// rows of the same batch are unaffected.
#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "devmem/host_memory.h"
#include "engines/builtin.h"
#include "engines/catalog/builtin_engines.h"
#include "engines/dense_cpu.h"
#include "engines/dense_model.h"
#include "tests/unit/dense_reference.h"

namespace warmpool::testing {
namespace {

constexpr float kInfinity = INFINITY;

// Every path of the CPU layers: the AVX-512 kernels (1 to 4 rows), the f16 kernel (to 16 rows) and
// the oneDNN matmul above them.
constexpr uint32_t kLayerRowCounts[] = {1, 2, 3, 4, 5, 16, 17, 33};

const std::map<std::string, dense::Activation> kActivations = {
    {"relu", dense::Activation::kRelu}, {"gelu", dense::Activation::kGelu},
    {"tanh", dense::Activation::kTanh}, {"none", dense::Activation::kNone}};

// Two layers held in memory, as CpuLayers reads them: the first with positive weights, so that an
// infinite input (or a sum that overflows) makes every hidden unit the same infinity and the
// activation's limit decides the row; the second with weights of both signs.
struct Model {
  ReferenceModel reference;
  dense::DenseModel layers;
  std::vector<uint8_t> bytes;
};

Model MakeModel(DType dtype, const std::string& activation, uint32_t in, uint32_t hidden, uint32_t out) {
  Model model;
  model.reference.activation = activation;
  model.layers.activation = kActivations.at(activation);
  model.layers.in_features = in;
  model.layers.out_features = out;
  std::mt19937 generator(41);
  const uint32_t sizes[] = {in, hidden, out};
  for (uint64_t l = 0; l < 2; ++l) {
    LayerSpec spec{l, sizes[l], sizes[l + 1], true, dtype, dtype};
    ReferenceLayer layer{spec, {}, {}};
    std::vector<float> weights = RandomValues(spec.in * spec.out, 0.3, generator);
    if (l == 0) {
      for (float& w : weights) w = 0.05f + std::fabs(w);
    }
    const std::vector<float> bias = RandomValues(spec.out, 0.3, generator);
    dense::LinearLayer linear;
    linear.index = l;
    linear.in_features = static_cast<uint32_t>(spec.in);
    linear.out_features = static_cast<uint32_t>(spec.out);
    auto add = [&](const std::vector<float>& values, std::vector<double>& stored, std::vector<uint64_t> shape) {
      const std::vector<uint8_t> encoded = Encode(values, dtype, stored);
      safetensors::TensorInfo tensor{fmt::format("{}.{}", l, shape.size() == 2 ? "weight" : "bias"), dtype,
                                     std::move(shape), model.bytes.size(), model.bytes.size() + encoded.size()};
      model.bytes.insert(model.bytes.end(), encoded.begin(), encoded.end());
      return tensor;
    };
    linear.weight = add(weights, layer.weight, {spec.out, spec.in});
    linear.bias = add(bias, layer.bias, {spec.out});
    model.layers.layers.push_back(linear);
    model.reference.layers.push_back(std::move(layer));
  }
  return model;
}

// Row patterns: ordinary; one NaN; one +Inf or -Inf; every input huge (the positive sum overflows
// to +-Inf in f32, as in the reference's f32 rounding of the layer's output); one huge input; all
// subnormal.
std::vector<float> PatternRow(size_t pattern, uint32_t in, std::mt19937& generator) {
  std::vector<float> row = RandomValues(in, 1.0, generator);
  switch (pattern % 8) {
    case 1: row[in / 2] = NAN; break;
    case 2: row[0] = kInfinity; break;
    case 3: row[in - 1] = -kInfinity; break;
    case 4: row.assign(in, 3e38f); break;
    case 5: row.assign(in, -3e38f); break;
    case 6: row[1] = -3e38f; break;
    case 7: row.assign(in, 1e-40f); break;
    default: break;
  }
  return row;
}

TEST(CpuLayersNonFinite, EveryPathKeepsNonFiniteRowsAndTheLimitsOfEachActivation) {
  const uint32_t in = 37, hidden = 21, out = 5;
  for (DType dtype : {DType::F32, DType::F16, DType::BF16}) {
    for (const auto& [activation, unused] : kActivations) {
      Model model = MakeModel(dtype, activation, in, hidden, out);
      dense::StoredBytes stored = [&](const safetensors::TensorInfo& tensor) -> Result<const uint8_t*> {
        return model.bytes.data() + tensor.begin;
      };
      Result<std::unique_ptr<dense::CpuLayers>> layers = dense::CpuLayers::Start(model.layers, stored);
      ASSERT_TRUE(layers.ok()) << layers.status().ToString();
      std::mt19937 generator(43);
      for (uint32_t rows : kLayerRowCounts) {
        std::vector<float> input;
        for (uint32_t r = 0; r < rows; ++r) {
          const std::vector<float> row = PatternRow(r + rows, in, generator);  // every pattern at each size
          input.insert(input.end(), row.begin(), row.end());
        }
        std::vector<float> output(size_t{rows} * out, -1.0f);
        ASSERT_TRUE((*layers)->Run(input.data(), rows, output.data(), stored).ok());
        ExpectCpuClose(output, model.reference, input, rows,
                       fmt::format("{} {} rows {}", DTypeName(dtype), activation, rows));
      }
    }
  }
}

// Through the real engine: a ReLU model, and in each batch one row with a single NaN. That row
// gives NaN everywhere (NaN * w reaches every hidden unit, and ReLU(NaN) is NaN), and the other
// rows of the same batch are what they are without it.
TEST(DenseEngineNonFinite, ANaNRowGivesNaNAndLeavesTheOtherRowsAlone) {
  TempDir dir;
  for (DType dtype : {DType::F32, DType::F16, DType::BF16}) {
    const std::string path = dir.File(fmt::format("relu_{}.safetensors", DTypeName(dtype)));
    ReferenceModel model =
        WriteModel(path, {{0, 67, 40, true, dtype, dtype}, {2, 40, 24, true, dtype, dtype}, {4, 24, 6, true, dtype, dtype}},
                   "relu", 47);
    HostMemory memory;
    Result<Engine> engine = Engine::Open(FindBuiltinEngine("dense"), Spec(path), memory.service());
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    ASSERT_TRUE(engine->Load().ok());
    std::mt19937 generator(53);
    for (uint32_t rows : kLayerRowCounts) {
      std::vector<float> input = RandomValues(size_t{rows} * 67, 1.0, generator);
      const uint32_t bad = rows / 2;
      input[size_t{bad} * 67 + 33] = NAN;
      std::vector<float> output;
      ASSERT_TRUE(engine->Infer(input, rows, 67, output).ok());
      const std::string context = fmt::format("{} rows {}", DTypeName(dtype), rows);
      for (uint32_t n = 0; n < 6; ++n) EXPECT_TRUE(std::isnan(output[size_t{bad} * 6 + n])) << context << " output " << n;
      ExpectCpuClose(output, model, input, rows, context);
    }
  }
}

}  // namespace
}  // namespace warmpool::testing
