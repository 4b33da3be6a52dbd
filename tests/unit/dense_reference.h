// Dense models for the tests, written to files, and the naive double-precision reference their
// engines are checked against (tests/unit/dense_engine_test.cc on the CPU, dense_gpu_test.cc on a
// GPU).
#pragma once

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "engines/half.h"
#include "engines/safetensors.h"
#include "warmpool/engine.h"

namespace warmpool::testing {

using safetensors::DType;
using safetensors::TensorToWrite;

class TempDir {
 public:
  TempDir() {
    char pattern[] = "/tmp/dense_engine_test.XXXXXX";
    path_ = mkdtemp(pattern);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// ---- building models and the reference they are checked against ----

struct LayerSpec {
  uint64_t index;
  uint64_t in;
  uint64_t out;
  bool has_bias = true;
  DType weight_dtype = DType::F32;
  DType bias_dtype = DType::F32;
};

// What the file holds, as doubles of exactly the stored (rounded) values.
struct ReferenceLayer {
  LayerSpec spec;
  std::vector<double> weight;  // [out, in]
  std::vector<double> bias;    // [out] or empty
};

struct ReferenceModel {
  std::vector<ReferenceLayer> layers;
  std::string activation = "relu";
};

inline std::vector<uint8_t> Encode(const std::vector<float>& values, DType dtype, std::vector<double>& stored) {
  std::vector<uint8_t> bytes;
  stored.clear();
  for (float value : values) {
    if (dtype == DType::F32) {
      const auto* raw = reinterpret_cast<const uint8_t*>(&value);
      bytes.insert(bytes.end(), raw, raw + 4);
      stored.push_back(value);
      continue;
    }
    const uint16_t bits = dtype == DType::F16 ? safetensors::FloatToHalf(value) : safetensors::FloatToBF16(value);
    bytes.push_back(static_cast<uint8_t>(bits & 0xff));
    bytes.push_back(static_cast<uint8_t>(bits >> 8));
    stored.push_back(dtype == DType::F16 ? safetensors::HalfToFloat(bits) : safetensors::BF16ToFloat(bits));
  }
  return bytes;
}

inline std::vector<float> RandomValues(size_t count, double bound, std::mt19937& generator) {
  std::uniform_real_distribution<float> distribution(static_cast<float>(-bound), static_cast<float>(bound));
  std::vector<float> values(count);
  for (float& value : values) value = distribution(generator);
  return values;
}

// Writes the layers (bias before weight when bias_first, to misalign f32 weights after 16-bit biases).
inline ReferenceModel WriteModel(const std::string& path, const std::vector<LayerSpec>& specs, const std::string& activation,
                          unsigned seed = 1, bool bias_first = false) {
  std::mt19937 generator(seed);
  ReferenceModel model;
  model.activation = activation;
  std::vector<TensorToWrite> tensors;
  for (const LayerSpec& spec : specs) {
    ReferenceLayer layer{spec, {}, {}};
    const double bound = 1.0 / std::sqrt(static_cast<double>(spec.in));
    TensorToWrite weight{fmt::format("{}.weight", spec.index), spec.weight_dtype, {spec.out, spec.in},
                         Encode(RandomValues(spec.out * spec.in, bound, generator), spec.weight_dtype, layer.weight)};
    std::optional<TensorToWrite> bias;
    if (spec.has_bias) {
      bias = TensorToWrite{fmt::format("{}.bias", spec.index), spec.bias_dtype, {spec.out},
                           Encode(RandomValues(spec.out, bound, generator), spec.bias_dtype, layer.bias)};
    }
    if (bias && bias_first) tensors.push_back(*bias);
    tensors.push_back(weight);
    if (bias && !bias_first) tensors.push_back(*bias);
    model.layers.push_back(std::move(layer));
  }
  Status written = safetensors::WriteFile(path, tensors, {{"activation", activation}, {"engine", "dense"}});
  EXPECT_TRUE(written.ok()) << written.ToString();
  return model;
}

inline double ReferenceActivation(const std::string& activation, double x) {
  if (activation == "relu") return x > 0 ? x : 0;
  if (activation == "gelu") return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
  if (activation == "tanh") return std::tanh(x);
  return x;
}

// Whether a layer with bf16 weights takes its input rounded to bf16, as the CPU engine's bf16
// matmul (oneDNN) does.
enum class Bf16Input { kExact, kNarrowed };

// Naive triple loop in double precision.
inline std::vector<double> ReferenceForward(const ReferenceModel& model, const std::vector<float>& input, size_t rows,
                                           Bf16Input bf16_input = Bf16Input::kExact) {
  std::vector<double> x(input.begin(), input.end());
  for (size_t l = 0; l < model.layers.size(); ++l) {
    const ReferenceLayer& layer = model.layers[l];
    if (bf16_input == Bf16Input::kNarrowed && layer.spec.weight_dtype == DType::BF16) {
      for (double& value : x) value = safetensors::BF16ToFloat(safetensors::FloatToBF16(static_cast<float>(value)));
    }
    const size_t in = layer.spec.in;
    const size_t out = layer.spec.out;
    std::vector<double> y(rows * out);
    for (size_t r = 0; r < rows; ++r) {
      for (size_t o = 0; o < out; ++o) {
        double sum = layer.bias.empty() ? 0.0 : layer.bias[o];
        for (size_t i = 0; i < in; ++i) sum += x[r * in + i] * layer.weight[o * in + i];
        y[r * out + o] = l + 1 < model.layers.size() ? ReferenceActivation(model.activation, sum) : sum;
      }
    }
    x = std::move(y);
  }
  return x;
}

inline void ExpectClose(const std::vector<float>& got, const std::vector<double>& want, double relative, double absolute,
                 const std::string& context) {
  ASSERT_EQ(got.size(), want.size()) << context;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], absolute + relative * std::fabs(want[i])) << context << " at element " << i;
  }
}

// The CPU engine against ReferenceForward(..., Bf16Input::kNarrowed): f32 and f16 layers compute
// in f32 (f16 weights widen exactly); where a bf16 layer is involved, an input within f32 rounding
// of a bf16 rounding boundary may round the other way (one bf16 step, 2^-8, on that element).
struct Tolerance {
  double relative;
  double absolute;
};
inline Tolerance CpuTolerance(bool has_bf16_layer) {
  return has_bf16_layer ? Tolerance{1e-3, 2e-3} : Tolerance{1e-4, 1e-5};
}
inline bool HasBf16Layer(const ReferenceModel& model) {
  for (const ReferenceLayer& layer : model.layers) {
    if (layer.spec.weight_dtype == DType::BF16) return true;
  }
  return false;
}
// The CPU engine's output against the reference, within CpuTolerance.
inline void ExpectCpuClose(const std::vector<float>& got, const ReferenceModel& model, const std::vector<float>& input,
                           size_t rows, const std::string& context) {
  const Tolerance t = CpuTolerance(HasBf16Layer(model));
  ExpectClose(got, ReferenceForward(model, input, rows, Bf16Input::kNarrowed), t.relative, t.absolute, context);
}

inline wp_engine_spec Spec(const std::string& path, const char* name = "m") { return wp_engine_spec{name, path.c_str()}; }

}  // namespace warmpool::testing
