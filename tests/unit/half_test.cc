// 16-bit floats (engines/half.h): f16 and bf16 from and to f32, exact values, rounding to nearest
// even, and every f16 round-tripping.
#include "engines/half.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include <gtest/gtest.h>

namespace warmpool::safetensors {
namespace {

TEST(Half, ExactValues) {
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xc000);
  EXPECT_EQ(FloatToHalf(0.0f), 0x0000);
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(0x1p-14f), 0x0400);  // smallest normal
  EXPECT_EQ(FloatToHalf(0x1p-24f), 0x0001);  // smallest subnormal
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(FloatToHalf(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_EQ(HalfToFloat(0x3c00), 1.0f);
  EXPECT_EQ(HalfToFloat(0x3555), 0x1.554p-2f);
  EXPECT_EQ(HalfToFloat(0x0001), 0x1p-24f);
  EXPECT_EQ(HalfToFloat(0x03ff), 1023 * 0x1p-24f);
  EXPECT_EQ(HalfToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(HalfToFloat(0xfc00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::signbit(HalfToFloat(0x8000)));
  EXPECT_TRUE(std::isnan(HalfToFloat(0x7e00)));
  uint16_t nan = FloatToHalf(std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE(std::isnan(HalfToFloat(nan)));
}

TEST(Half, RoundsToNearestEven) {
  EXPECT_EQ(FloatToHalf(1.0f + 0x1p-11f), 0x3c00);                // tie, down to even
  EXPECT_EQ(FloatToHalf(1.0f + 3 * 0x1p-11f), 0x3c02);            // tie, up to even
  EXPECT_EQ(FloatToHalf(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);     // just above the tie
  EXPECT_EQ(FloatToHalf(65519.0f), 0x7bff);                       // below the overflow tie
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);                       // tie rounds to inf
  EXPECT_EQ(FloatToHalf(0x1p-25f), 0x0000);                       // subnormal tie, down to even 0
  EXPECT_EQ(FloatToHalf(3 * 0x1p-25f), 0x0002);                   // subnormal tie, up to even
  EXPECT_EQ(FloatToHalf(1023.5f * 0x1p-24f), 0x0400);             // subnormal carries into normal
  EXPECT_EQ(FloatToHalf(0x1p-26f), 0x0000);                       // underflow
  EXPECT_EQ(FloatToHalf(2047.0f + 1.0f), 0x6800);                 // 2048
  EXPECT_EQ(FloatToHalf(2049.0f), 0x6800);                        // tie between 2048 and 2050
  EXPECT_EQ(FloatToHalf(2051.0f), 0x6802);                        // tie between 2050 and 2052
}

TEST(Half, EveryHalfRoundTrips) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const auto half = static_cast<uint16_t>(bits);
    const float value = HalfToFloat(half);
    if (std::isnan(value)) continue;
    ASSERT_EQ(FloatToHalf(value), half) << "bits 0x" << std::hex << bits;
  }
}

TEST(BF16, ExactValues) {
  EXPECT_EQ(FloatToBF16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBF16(-2.0f), 0xc000);
  EXPECT_EQ(BF16ToFloat(0x4049), 3.140625f);
  EXPECT_EQ(BF16ToFloat(0x3f80), 1.0f);
  EXPECT_EQ(FloatToBF16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_TRUE(std::isnan(BF16ToFloat(FloatToBF16(std::numeric_limits<float>::quiet_NaN()))));
  // A NaN whose payload lives only in the low 16 bits must not truncate to inf.
  EXPECT_TRUE(std::isnan(BF16ToFloat(FloatToBF16(std::bit_cast<float>(0x7f800001u)))));
}

TEST(BF16, RoundsToNearestEven) {
  EXPECT_EQ(FloatToBF16(1.0f + 0x1p-8f), 0x3f80);              // tie, down to even
  EXPECT_EQ(FloatToBF16(1.0f + 3 * 0x1p-8f), 0x3f82);          // tie, up to even
  EXPECT_EQ(FloatToBF16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);   // just above the tie
  EXPECT_EQ(FloatToBF16(std::numeric_limits<float>::max()), 0x7f80);  // overflows to inf
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const float value = BF16ToFloat(static_cast<uint16_t>(bits));
    if (std::isnan(value)) continue;
    ASSERT_EQ(FloatToBF16(value), bits);
  }
}

}  // namespace
}  // namespace warmpool::safetensors
