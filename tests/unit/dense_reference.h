// Dense models for the tests, written to files, and the naive double-precision reference their
// engines are checked against (tests/unit/dense_engine_test.cc on the CPU, dense_gpu_test.cc on a
// GPU).
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "engines/builtin.h"
#include <gtest/gtest.h>

#include "engines/dense_cpu.h"
#include "tests/unit/temp_dir.h"
#include "engines/half.h"
#include "engines/safetensors.h"
#include "warmpool/engine.h"

namespace warmpool::testing {

using safetensors::DType;
using safetensors::TensorToWrite;


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

// ---- number formats from their definitions (IEEE 754; bfloat16 is the upper half of binary32) ----
// Written apart from engines/half.h, whose conversions the engine uses: the reference must not
// share a mistake with the code it checks.

struct BinaryFormat {
  int digits;    // significant bits, the implicit one included
  int min_exp;   // exponent of the smallest normal number
  int max_exp;   // exponent of the largest finite number
};
inline constexpr BinaryFormat kBinary32{24, -126, 127};
inline constexpr BinaryFormat kBinary16{11, -14, 15};
inline constexpr BinaryFormat kBfloat16{8, -126, 127};

// x rounded to the format: to nearest, ties to even, on the subnormal grid below the normal range;
// a magnitude that rounds to 2^(max_exp + 1) or beyond is an infinity (IEEE 754's overflow).
inline double RoundTo(const BinaryFormat& format, double x) {
  if (!std::isfinite(x) || x == 0) return x;
  const int exponent = std::max(std::ilogb(x), format.min_exp);
  const double ulp = std::ldexp(1.0, exponent - (format.digits - 1));
  const double rounded = std::nearbyint(x / ulp) * ulp;  // the default mode: nearest, ties to even
  if (std::fabs(rounded) >= std::ldexp(1.0, format.max_exp + 1)) return std::copysign(INFINITY, x);
  return rounded;
}
inline float ToFloat(double x) { return static_cast<float>(RoundTo(kBinary32, x)); }

// binary16: (-1)^s 2^(e-15) (1 + m/2^10); e = 0: (-1)^s 2^-14 m/2^10; e = 31: Inf (m = 0) or NaN.
inline double HalfValue(uint16_t bits) {
  const double sign = (bits & 0x8000) != 0 ? -1.0 : 1.0;
  const int e = (bits >> 10) & 0x1f;
  const int m = bits & 0x3ff;
  if (e == 0x1f) return m == 0 ? sign * INFINITY : NAN;
  if (e == 0) return sign * std::ldexp(m, -24);
  return sign * std::ldexp(1024 + m, e - 25);
}
inline double Bf16Value(uint16_t bits) { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }

// The stored bytes of the values (what engine code writes a file with), and in `stored` the values
// those bytes hold, decoded by the definitions above.
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
    stored.push_back(dtype == DType::F16 ? HalfValue(bits) : Bf16Value(bits));
    // The file's value is the value rounded to the format (a NaN stays a NaN).
    const double rounded = RoundTo(dtype == DType::F16 ? kBinary16 : kBfloat16, value);
    EXPECT_TRUE(stored.back() == rounded || (std::isnan(stored.back()) && std::isnan(rounded)))
        << "stored " << stored.back() << " for " << value << ", rounded " << rounded;
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

// The activations as defined (PyTorch's relu, exact-erf gelu, tanh): NaN in gives NaN, and +-Inf
// give the limits.
inline double ReferenceActivation(const std::string& activation, double x) {
  if (std::isnan(x)) return x;
  if (activation == "relu") return x > 0 ? x : 0.0;
  if (activation == "gelu") {
    // x * Phi(x), Phi(x) = erfc(-x / sqrt 2) / 2; its limit at -Inf is 0 (the formula is -Inf * 0).
    return x == -INFINITY ? 0.0 : 0.5 * x * std::erfc(-x / std::sqrt(2.0));
  }
  if (activation == "tanh") return std::tanh(x);
  return x;
}

// Whether a layer with bf16 weights takes its input rounded to bf16, as the CPU engine's bf16
// matmul (oneDNN) does.
enum class Bf16Input { kExact, kNarrowed };

// Naive triple loop in double precision. Each layer's output is an f32 tensor, as in the model
// (PyTorch's float32 nn.Linear), so it is rounded to f32 before and after the activation: a sum
// beyond the f32 range is an infinity for the next layer, as in the engine.
inline std::vector<double> ReferenceForward(const ReferenceModel& model, const std::vector<float>& input, size_t rows,
                                           Bf16Input bf16_input = Bf16Input::kExact) {
  std::vector<double> x(input.begin(), input.end());
  for (size_t l = 0; l < model.layers.size(); ++l) {
    const ReferenceLayer& layer = model.layers[l];
    if (bf16_input == Bf16Input::kNarrowed && layer.spec.weight_dtype == DType::BF16) {
      for (double& value : x) value = RoundTo(kBfloat16, value);
    }
    const size_t in = layer.spec.in;
    const size_t out = layer.spec.out;
    std::vector<double> y(rows * out);
    for (size_t r = 0; r < rows; ++r) {
      for (size_t o = 0; o < out; ++o) {
        double sum = layer.bias.empty() ? 0.0 : layer.bias[o];
        for (size_t i = 0; i < in; ++i) sum += x[r * in + i] * layer.weight[o * in + i];
        sum = ToFloat(sum);
        y[r * out + o] = l + 1 < model.layers.size() ? ToFloat(ReferenceActivation(model.activation, sum)) : sum;
      }
    }
    x = std::move(y);
  }
  return x;
}

// got[i] against want[i] (a reference value, rounded to f32 here): NaN only where the reference is
// NaN, the same infinity only where it is infinite, and within absolute + relative * |want| (and
// finite) elsewhere. Non-finite in the reference is never matched by a plausible finite number.
inline ::testing::AssertionResult MatchesReference(float got, double want, double relative, double absolute) {
  const float expected = ToFloat(want);
  if (std::isnan(expected)) {
    if (std::isnan(got)) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "got " << got << " where the reference is NaN";
  }
  if (std::isinf(expected)) {
    if (got == expected) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "got " << got << " where the reference is " << expected;
  }
  if (std::isfinite(got) && std::fabs(got - want) <= absolute + relative * std::fabs(want)) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "got " << got << ", the reference is " << want << " (within "
                                       << absolute << " + " << relative << " * |reference|)";
}

inline void ExpectClose(const std::vector<float>& got, const std::vector<double>& want, double relative, double absolute,
                 const std::string& context) {
  ASSERT_EQ(got.size(), want.size()) << context;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(MatchesReference(got[i], want[i], relative, absolute)) << context << " at element " << i;
  }
}

// The CPU engine against ReferenceForward: f32 and f16 layers compute
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
// The CPU engine's output against the reference, within CpuTolerance. Whether a bf16 layer's input
// is narrowed depends on the CPU (dense::HaveBF16Matmul): the engine says which.
inline void ExpectCpuClose(const std::vector<float>& got, const ReferenceModel& model, const std::vector<float>& input,
                           size_t rows, const std::string& context) {
  const Tolerance t = CpuTolerance(HasBf16Layer(model));
  const Bf16Input bf16_input = dense::HaveBF16Matmul() ? Bf16Input::kNarrowed : Bf16Input::kExact;
  ExpectClose(got, ReferenceForward(model, input, rows, bf16_input), t.relative, t.absolute, context);
}

inline wp_engine_spec Spec(const std::string& path, const char* name = "m") { return SpecForFile(name, path.c_str(), nullptr, 0, 0); }

}  // namespace warmpool::testing
