// The dense engine's small-batch kernels (f16, f32, bf16) against a double-precision product.
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "engines/bf16_gemv.h"
#include "engines/dense_cpu.h"
#include "engines/gemv.h"
#include "engines/half.h"
#include "engines/safetensors.h"
#include "tests/unit/dense_reference.h"

namespace warmpool {
namespace {

using namespace warmpool::testing;

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

// A row's sums are the same bits whatever rows share its call, and on any number of threads: a
// sequence's decode step in the transformer engine goes through here alone or beside others, and
// its greedy tokens must not depend on which (nor a stream resumed on another worker diverge from
// the one it continues). Outputs a kernel takes four or three at a time, one by one at a block's
// end (70 outputs: blocks of 24, 24 and 22), and five to eight rows whose accumulators are not a
// multiple of four.
TEST(BF16Gemv, ARowsSumsAreTheSameBitsInAnyBatch) {
  if (!dense::HaveBF16Gemv()) GTEST_SKIP() << "this CPU has no AVX-512 BF16";
  std::mt19937 generator(23);
  const uint32_t in = 4099, out = 70;
  std::vector<uint16_t> w(size_t{in} * out);
  const std::vector<float> weights = RandomValues(w.size(), 0.05, generator);
  for (size_t i = 0; i < w.size(); ++i) w[i] = safetensors::FloatToBF16(weights[i]);
  const std::vector<float> bias = RandomValues(out, 0.5, generator);
  const uint32_t most = 24;
  const std::vector<float> values = RandomValues(size_t{most} * in, 1.0, generator);
  std::vector<uint16_t> x(values.size());
  for (size_t i = 0; i < values.size(); ++i) x[i] = safetensors::FloatToBF16(values[i]);
  const auto* weight = reinterpret_cast<const uint8_t*>(w.data());
  std::vector<float> alone(size_t{most} * out);
  for (uint32_t r = 0; r < most; ++r) {
    dense::BF16Gemv(weight, in, out, x.data() + size_t{r} * in, 1, bias.data(), alone.data() + size_t{r} * out, 1);
  }
  for (int threads : {1, 2}) {
    for (uint32_t rows = 1; rows <= most; ++rows) {
      std::vector<float> y(size_t{rows} * out);
      dense::BF16Gemv(weight, in, out, x.data(), rows, bias.data(), y.data(), threads);
      for (uint32_t r = 0; r < rows; ++r) {
        for (uint32_t n = 0; n < out; ++n) {
          ASSERT_EQ(y[size_t{r} * out + n], alone[size_t{r} * out + n])
              << "rows " << rows << " row " << r << " output " << n << " threads " << threads;
        }
      }
    }
  }
}

// The same of the f16 kernel on each instruction set (the transformer engine's steps on f16
// weights) and of the f32 one (the dense engine's).
TEST(F16Gemv, ARowsSumsAreTheSameBitsInAnyBatch) {
  std::mt19937 generator(29);
  const uint32_t in = 4117, out = 70, most = 20;
  const std::vector<float> weights = RandomValues(size_t{in} * out, 0.05, generator);
  std::vector<uint16_t> halves(weights.size());
  for (size_t i = 0; i < weights.size(); ++i) halves[i] = safetensors::FloatToHalf(weights[i]);
  const std::vector<float> bias = RandomValues(out, 0.5, generator);
  const std::vector<float> x = RandomValues(size_t{most} * in, 1.0, generator);
  const auto* weight = reinterpret_cast<const uint8_t*>(halves.data());
  using Kernel = std::function<void(const float*, uint32_t, float*, int)>;
  std::vector<std::pair<std::string, Kernel>> kernels;
  for (dense::F16Isa isa : {dense::F16Isa::kAvx2, dense::F16Isa::kAvx512}) {
    if (!dense::HaveF16Isa(isa)) continue;
    kernels.emplace_back(isa == dense::F16Isa::kAvx2 ? "f16 avx2" : "f16 avx512",
                         [&, isa](const float* rows_x, uint32_t rows, float* y, int threads) {
                           dense::F16GemvOn(isa, weight, in, out, rows_x, rows, bias.data(), y, threads);
                         });
  }
  if (dense::HaveF32Gemv()) {
    kernels.emplace_back("f32", [&](const float* rows_x, uint32_t rows, float* y, int threads) {
      dense::F32Gemv(reinterpret_cast<const uint8_t*>(weights.data()), in, out, rows_x, rows, bias.data(), y, threads);
    });
  }
  if (kernels.empty()) GTEST_SKIP() << "this CPU has none of the kernels";
  for (const auto& [name, kernel] : kernels) {
    std::vector<float> alone(size_t{most} * out);
    for (uint32_t r = 0; r < most; ++r) kernel(x.data() + size_t{r} * in, 1, alone.data() + size_t{r} * out, 1);
    for (int threads : {1, 2}) {
      for (uint32_t rows = 1; rows <= most; ++rows) {
        std::vector<float> y(size_t{rows} * out);
        kernel(x.data(), rows, y.data(), threads);
        for (uint32_t r = 0; r < rows; ++r) {
          for (uint32_t n = 0; n < out; ++n) {
            ASSERT_EQ(y[size_t{r} * out + n], alone[size_t{r} * out + n])
                << name << " rows " << rows << " row " << r << " output " << n << " threads " << threads;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace warmpool
