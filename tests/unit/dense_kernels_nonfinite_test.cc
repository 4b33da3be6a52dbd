// The dense engine's small-batch kernels (f32, f16 and bf16 GEMV) and its activations fed NaN,
// +-Inf, huge values whose products overflow, and subnormals, in inputs, weights and biases,
// against a double-precision reference from the definition (tests/unit/dense_reference.h): a
// non-finite result of the math must come out non-finite (NaN as NaN, the same infinity), never
// as a plausible finite number, and everything else as the ordinary tests require.
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "engines/bf16_gemv.h"
#include "engines/dense_cpu.h"
#include "engines/gemv.h"
#include "tests/unit/dense_reference.h"

namespace warmpool::testing {
namespace {

constexpr float kInf = INFINITY;
constexpr float kHuge = 3e38f;       // any product with a weight above about 1.13 overflows
constexpr float kSubnormal = 1e-40f;  // f32 (and bf16) subnormal

// Row counts: each pass of the AVX-512 kernels (1 to 4 rows; the bf16 kernel's up to 8, outputs in
// threes from 5 rows), and more than one pass.
constexpr uint32_t kRowCounts[] = {1, 2, 3, 4, 5, 7, 8, 9};
// Inputs with a tail only, with whole vectors of 32 and 16 and a tail, and with two of 32 and a tail.
constexpr uint32_t kInputCounts[] = {7, 53, 67};
// Outputs in fours (or threes) and one alone; each output below has its own weights.
constexpr uint32_t kOutputs = 13;

// An output's weights and bias (row n of W): ordinary values with, for some outputs, one special.
struct Layer {
  std::vector<float> weights;  // [kOutputs, in]
  std::vector<float> bias;     // [kOutputs]
};

Layer MakeLayer(uint32_t in, std::mt19937& generator) {
  Layer layer{RandomValues(size_t{kOutputs} * in, 0.15, generator), RandomValues(kOutputs, 0.5, generator)};
  auto w = [&](uint32_t n, uint32_t k) -> float& { return layer.weights[size_t{n} * in + k]; };
  const uint32_t tail = in - 1, middle = in / 2;
  w(1, middle) = 4.0f;            // with a huge input there: the product overflows to Inf
  w(2, 0) = NAN;                  // NaN for every row
  w(3, tail) = kInf;              // +-Inf by the input's sign; NaN with another infinity
  w(4, middle) = 1e38f;           // huge but finite products (in f16 storage: Inf)
  for (uint32_t k = 0; k < in; k += 2) w(5, k) = kSubnormal;  // f16 stores 0; bf16 hardware reads 0
  w(6, 0) = w(6, middle) = w(6, tail) = 0.0f;  // 0 * Inf = NaN where an input is infinite
  w(10, tail) = -kInf;
  layer.bias[7] = NAN;
  layer.bias[12] = kInf;  // the output computed alone, after the fours
  return layer;
}

// Input rows: ordinary ones, and each special value at the first, a middle and the last position.
std::vector<std::vector<float>> MakeRows(uint32_t in, std::mt19937& generator) {
  std::vector<std::vector<float>> rows;
  rows.push_back(RandomValues(in, 1.0, generator));
  for (float special : {NAN, kInf, -kInf, kHuge, -kHuge, kSubnormal}) {
    for (uint32_t position : {0u, in / 2, in - 1}) {
      std::vector<float> row = RandomValues(in, 1.0, generator);
      row[position] = special;
      rows.push_back(row);
    }
  }
  std::vector<float> subnormals(in, -kSubnormal);
  rows.push_back(subnormals);
  rows.push_back(RandomValues(in, 1.0, generator));
  return rows;
}

// The kernel's output for `count` rows from `first` against the reference of the stored values.
// weight_values and input_values: what the kernel's weight and input bytes hold, decoded by the
// reference; bias: f32, or none.
void ExpectRowsMatch(const std::vector<float>& got, const std::vector<double>& weight_values,
                     const std::vector<double>& input_values, const float* bias, uint32_t in, uint32_t count,
                     const std::string& context) {
  for (uint32_t r = 0; r < count; ++r) {
    for (uint32_t n = 0; n < kOutputs; ++n) {
      double want = bias != nullptr ? bias[n] : 0.0;
      for (uint32_t k = 0; k < in; ++k) want += weight_values[size_t{n} * in + k] * input_values[size_t{r} * in + k];
      ASSERT_TRUE(MatchesReference(got[size_t{r} * kOutputs + n], want, 1e-4, 1e-4))
          << context << " row " << r << " output " << n;
    }
  }
}

// Every row count over every window of the special rows, with and without a bias. run(x, rows,
// bias, y) calls the kernel on the first `rows` rows of x (f32 values; a bf16 kernel narrows them
// itself); decode gives the reference's value of an input as the kernel reads it.
template <typename Run, typename Decode>
void ForEveryCall(uint32_t in, const Layer& layer, const std::vector<double>& weight_values,
                  const std::vector<std::vector<float>>& rows, Run run, Decode decode, const std::string& context) {
  for (uint32_t count : kRowCounts) {
    for (size_t first = 0; first + count <= rows.size(); first += count) {
      std::vector<float> x;
      for (uint32_t r = 0; r < count; ++r) x.insert(x.end(), rows[first + r].begin(), rows[first + r].end());
      std::vector<double> x_values(x.size());
      for (size_t i = 0; i < x.size(); ++i) x_values[i] = decode(x[i]);
      for (bool with_bias : {true, false}) {
        const float* bias = with_bias ? layer.bias.data() : nullptr;
        std::vector<float> y(size_t{count} * kOutputs, -1.0f);
        run(x, count, bias, y);
        ExpectRowsMatch(y, weight_values, x_values, bias, in, count,
                        fmt::format("{} in {} rows {}..{} bias {}", context, in, first, first + count, with_bias));
        if (::testing::Test::HasFatalFailure()) return;
      }
    }
  }
}

TEST(F32GemvNonFinite, MatchesTheReferenceAtEveryRowCount) {
  if (!dense::HaveF32Gemv()) GTEST_SKIP() << "this CPU has no AVX-512F";
  std::mt19937 generator(23);
  for (uint32_t in : kInputCounts) {
    const Layer layer = MakeLayer(in, generator);
    std::vector<double> weight_values;
    std::vector<uint8_t> stored = Encode(layer.weights, DType::F32, weight_values);
    stored.insert(stored.begin(), 0);  // weights at an odd address, as safetensors may place them
    ForEveryCall(
        in, layer, weight_values, MakeRows(in, generator),
        [&](const std::vector<float>& x, uint32_t count, const float* bias, std::vector<float>& y) {
          dense::F32Gemv(stored.data() + 1, in, kOutputs, x.data(), count, bias, y.data(), 1);
        },
        [](float value) { return double{value}; }, "f32");
  }
}

// f16 weights: 1e38 and the subnormal f32 weights do not fit binary16 and are stored as Inf and 0;
// the reference multiplies what is stored (and the input stays f32).
TEST(F16GemvNonFinite, MatchesTheReferenceOnEveryInstructionSet) {
  std::mt19937 generator(29);
  int tried = 0;
  for (dense::F16Isa isa : {dense::F16Isa::kAvx2, dense::F16Isa::kAvx512}) {
    if (!dense::HaveF16Isa(isa)) continue;
    ++tried;
    for (uint32_t in : kInputCounts) {
      Layer layer = MakeLayer(in, generator);
      layer.weights[size_t{8} * in + 1] = 3e-6f;  // an f16 subnormal (below 2^-14)
      std::vector<double> weight_values;
      const std::vector<uint8_t> stored = Encode(layer.weights, DType::F16, weight_values);
      ForEveryCall(
          in, layer, weight_values, MakeRows(in, generator),
          [&](const std::vector<float>& x, uint32_t count, const float* bias, std::vector<float>& y) {
            dense::F16GemvOn(isa, stored.data(), in, kOutputs, x.data(), count, bias, y.data(), 1);
          },
          [](float value) { return double{value}; }, fmt::format("f16 isa {}", static_cast<int>(isa)));
    }
  }
  if (tried == 0) GTEST_SKIP() << "this CPU has neither AVX2 nor AVX-512F with F16C";
}

// bf16: weights and inputs are rounded to bf16 (3e38 stays finite: bf16 has f32's range).
// VDPBF16PS reads subnormal operands as zero and flushes subnormal results (Intel SDM), as oneDNN's
// bf16 matmul on the same instructions does: the reference of this kernel reads a bf16 subnormal as
// zero too, so Inf times a subnormal weight is NaN here where exact arithmetic gives Inf, and a
// huge input times a subnormal weight adds nothing. Nothing finite becomes non-finite or back.
TEST(BF16GemvNonFinite, MatchesTheReferenceWithSubnormalsAsZero) {
  if (!dense::HaveBF16Gemv()) GTEST_SKIP() << "this CPU has no AVX-512 BF16";
  std::mt19937 generator(31);
  auto as_read = [](double value) { return std::fabs(value) < std::ldexp(1.0, -126) ? 0.0 * value : value; };
  for (uint32_t in : kInputCounts) {
    const Layer layer = MakeLayer(in, generator);
    std::vector<double> weight_values;
    std::vector<uint8_t> stored = Encode(layer.weights, DType::BF16, weight_values);
    for (double& value : weight_values) value = as_read(value);
    stored.insert(stored.begin(), 0);
    ForEveryCall(
        in, layer, weight_values, MakeRows(in, generator),
        [&](const std::vector<float>& x, uint32_t count, const float* bias, std::vector<float>& y) {
          std::vector<double> unused;
          const std::vector<uint8_t> narrowed = Encode(x, DType::BF16, unused);
          std::vector<uint16_t> halves(x.size());
          std::memcpy(halves.data(), narrowed.data(), narrowed.size());
          dense::BF16Gemv(stored.data() + 1, in, kOutputs, halves.data(), count, bias, y.data(), 1);
        },
        [&](float value) { return as_read(RoundTo(kBfloat16, value)); }, "bf16");
  }
}

// bf16 from the definition: the nearer of the two bf16 values around x (truncated, and one unit of
// its last place up in magnitude, the one past the largest finite being 2^128, which is Inf),
// ties to the even one; NaN stays NaN with its sign. Subnormal floats are flushed to zero, signed.
uint16_t NarrowedByDefinition(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const uint32_t sign = bits & 0x80000000u, magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return 0xffff;  // checked as "a NaN" by the caller
  if (magnitude < 0x00800000u) return static_cast<uint16_t>(sign >> 16);
  const uint32_t down = magnitude & 0xffff0000u, up = down + 0x10000u;
  const auto value = [](uint32_t m) {
    return m == 0x7f800000u ? std::ldexp(1.0, 128) : static_cast<double>(std::bit_cast<float>(m));
  };
  const double from_down = std::fabs(x) - value(down), to_up = value(up) - std::fabs(x);
  const uint32_t nearer = from_down < to_up ? down : to_up < from_down ? up : ((down >> 16) & 1) == 0 ? down : up;
  return static_cast<uint16_t>((sign | (magnitude == 0x7f800000u ? magnitude : nearer)) >> 16);
}

TEST(BF16Narrowing, RoundsToNearestEvenFlushesSubnormalsAndKeepsNaN) {
  if (!dense::HaveBF16Gemv()) GTEST_SKIP() << "this CPU has no AVX-512 BF16";
  std::vector<float> values = {0.0f, -0.0f, 1.0f, -1.5f, std::numeric_limits<float>::infinity(),
                               -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                               -std::numeric_limits<float>::signaling_NaN(), std::numeric_limits<float>::max(),
                               -std::numeric_limits<float>::max(), std::numeric_limits<float>::denorm_min(),
                               -std::numeric_limits<float>::min() / 2, std::numeric_limits<float>::min(),
                               std::bit_cast<float>(0x7f7f8000u),   // halfway past the largest finite: Inf
                               std::bit_cast<float>(0x7f7f7fffu),   // just below it: the largest finite
                               std::bit_cast<float>(0x3f808000u),   // a tie, the even one below
                               std::bit_cast<float>(0x3f818000u),   // a tie, the even one above
                               std::bit_cast<float>(0x007fffffu)};  // the largest subnormal
  std::mt19937 generator(41);
  std::uniform_int_distribution<uint32_t> any;
  while (values.size() < 300) values.push_back(std::bit_cast<float>(any(generator)));
  for (uint64_t count = 0; count <= values.size(); count += count < 70 ? 1 : 23) {
    std::vector<uint16_t> out(count + 40, 0xabcd);
    dense::NarrowToBF16(values.data(), count, out.data());
    for (uint64_t i = 0; i < count; ++i) {
      const uint16_t want = NarrowedByDefinition(values[i]);
      if (want == 0xffff) {
        EXPECT_TRUE(std::isnan(std::bit_cast<float>(uint32_t{out[i]} << 16)) &&
                    (out[i] & 0x8000) == (std::bit_cast<uint32_t>(values[i]) >> 16 & 0x8000))
            << "a NaN at " << i << " of " << count;
      } else {
        EXPECT_EQ(out[i], want) << fmt::format("{:#010x} at {} of {}", std::bit_cast<uint32_t>(values[i]), i, count);
      }
    }
    for (uint64_t i = count; i < out.size(); ++i) ASSERT_EQ(out[i], 0xabcd) << "written past " << count;
  }
}

// The activations the layers apply after the small-batch kernels (and ReLU and GELU after the
// batched matmul), element by element, over a length with a vector tail.
TEST(ActivationNonFinite, MatchesTheDefinitionWithItsLimits) {
  std::vector<float> values = {NAN, -NAN, kInf, -kInf, kHuge, -kHuge, kSubnormal, -kSubnormal, 0.0f, -0.0f,
                               1.0f, -1.0f, 0.5f, -3.0f, 9.0f, -12.0f, 1e-20f, -1e30f};
  std::mt19937 generator(37);
  for (float value : RandomValues(19, 4.0, generator)) values.push_back(value);
  for (const char* name : {"relu", "gelu", "tanh", "none"}) {
    const dense::Activation activation = std::string(name) == "relu"   ? dense::Activation::kRelu
                                         : std::string(name) == "gelu" ? dense::Activation::kGelu
                                         : std::string(name) == "tanh" ? dense::Activation::kTanh
                                                                       : dense::Activation::kNone;
    // Every offset: the vectorized loop's head and tail see each special value.
    for (size_t offset = 0; offset < 17; ++offset) {
      std::vector<float> got(values.begin() + offset, values.end());
      dense::Activate(activation, got.data(), got.size());
      for (size_t i = 0; i < got.size(); ++i) {
        const double want = ReferenceActivation(name, values[offset + i]);
        ASSERT_TRUE(MatchesReference(got[i], want, 1e-5, 1e-6)) << name << " of " << values[offset + i];
      }
    }
  }
}

}  // namespace
}  // namespace warmpool::testing
