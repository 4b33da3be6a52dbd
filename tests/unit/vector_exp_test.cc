// The vectorised exp (engines/transformer/vector_exp.h) against the definition, computed here in
// double: every float from -110 to 89 in fine steps, arrays of every length around the vector
// widths (a tail handled like the body), and hostile inputs: NaN, the infinities, the edges of
// overflow and of the denormals, signed zeros.
#include <gtest/gtest.h>

#include <bit>
#include <cfloat>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "engines/transformer/vector_exp.h"

namespace warmpool::transformer {
namespace {

// How far `got` is from exp(v), in the units that matter: relative where the exact value is a
// normal float, absolute (in the smallest denormal) below.
void ExpectExp(float v, float got) {
  const double exact = std::exp(static_cast<double>(v));
  if (exact > FLT_MAX) {
    EXPECT_EQ(got, std::numeric_limits<float>::infinity()) << "exp(" << v << ")";
  } else if (exact >= FLT_MIN) {
    EXPECT_LE(std::fabs(got - exact) / exact, 2e-7) << "exp(" << v << ") = " << got << ", not " << exact;
  } else {
    EXPECT_LE(std::fabs(got - exact), 2 * std::numeric_limits<float>::denorm_min()) << "exp(" << v << ")";
  }
}

TEST(VectorExpTest, EqualsTheDefinitionAcrossTheWholeRange) {
  std::vector<float> x;
  for (double v = -110; v < 89; v += 0.000731) x.push_back(static_cast<float>(v));
  std::vector<float> y = x;
  ExpInPlace(y.data(), y.size());
  for (size_t i = 0; i < x.size(); ++i) ExpectExp(x[i], y[i]);
}

TEST(VectorExpTest, EveryLengthAndTailComputesTheSame) {
  for (uint64_t n = 0; n <= 70; ++n) {
    std::vector<float> x(n), y;
    for (uint64_t i = 0; i < n; ++i) x[i] = -3.0f + 0.37f * static_cast<float>(i);
    y = x;
    ExpInPlace(y.data(), n);
    for (uint64_t i = 0; i < n; ++i) ExpectExp(x[i], y[i]);
  }
}

// A value's exp is the same bits at any index of a buffer of any length: the vector loop's body
// and its tails take different instructions, and the transformer engine's rows must not compute
// differently for where they sit in a step's buffer (a decode row alone or beside others).
TEST(VectorExpTest, AValuesExpIsTheSameBitsAtAnyIndexOfAnyLength) {
  std::mt19937 generator(31);
  std::uniform_real_distribution<float> value(-20.0f, 20.0f);
  std::vector<float> values(4096);
  for (float& v : values) v = value(generator);
  std::vector<float> alone = values;
  for (float& v : alone) ExpInPlace(&v, 1);
  for (uint64_t n = 1; n <= 48; ++n) {
    for (uint64_t first = 0; first + n <= values.size(); first += n) {
      std::vector<float> y(values.begin() + first, values.begin() + first + n);
      ExpInPlace(y.data(), n);
      for (uint64_t i = 0; i < n; ++i) {
        ASSERT_EQ(std::bit_cast<uint32_t>(y[i]), std::bit_cast<uint32_t>(alone[first + i]))
            << "exp(" << values[first + i] << ") at " << i << " of " << n;
      }
    }
  }
}

TEST(VectorExpTest, HostileInputs) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> x = {std::numeric_limits<float>::quiet_NaN(), inf, -inf, 0.0f, -0.0f, FLT_MAX, -FLT_MAX,
                          88.72283f, 88.72284f, -87.33654f, -103.97f, -104.5f, 1e-30f, -1e-30f};
  std::vector<float> y = x;
  ExpInPlace(y.data(), y.size());
  EXPECT_TRUE(std::isnan(y[0]));
  EXPECT_EQ(y[1], inf);
  EXPECT_EQ(y[2], 0.0f);
  EXPECT_EQ(y[3], 1.0f);
  EXPECT_EQ(y[4], 1.0f);
  EXPECT_EQ(y[5], inf);
  EXPECT_EQ(y[6], 0.0f);
  for (size_t i = 7; i < x.size(); ++i) ExpectExp(x[i], y[i]);
}

}  // namespace
}  // namespace warmpool::transformer
