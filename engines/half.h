// Conversions between f32 and the 16-bit float formats safetensors files store (IEEE half, bfloat16).
// Narrowing rounds to nearest, ties to even, as PyTorch's .half() and .bfloat16() do.
#pragma once

#include <bit>
#include <cstdint>

namespace warmpool::safetensors {

inline float HalfToFloat(uint16_t half) {
  const uint32_t sign = static_cast<uint32_t>(half & 0x8000u) << 16;
  const uint32_t exponent = (half >> 10) & 0x1fu;
  const uint32_t mantissa = half & 0x3ffu;
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24 is exact in f32.
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return sign != 0 ? -magnitude : magnitude;
  }
  if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  return std::bit_cast<float>(sign | ((exponent + (127 - 15)) << 23) | (mantissa << 13));
}

inline uint16_t FloatToHalf(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const auto sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude >= 0x7f800000u) {  // inf stays inf; every NaN becomes a quiet NaN
    return sign | (magnitude > 0x7f800000u ? 0x7e00u : 0x7c00u);
  }
  if (magnitude >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 rounds to inf
  if (magnitude < 0x38800000u) {
    // Below the smallest normal half (2^-14): adding 0.5f makes the FPU round the value to a
    // multiple of 2^-24, the half subnormal step, with ties to even.
    const float shifted = std::bit_cast<float>(magnitude) + 0.5f;
    return sign | static_cast<uint16_t>(std::bit_cast<uint32_t>(shifted) - 0x3f000000u);
  }
  // Rebias the exponent, then round the 13 dropped mantissa bits to nearest even; a carry out of
  // the mantissa correctly bumps the exponent.
  const uint32_t mantissa_odd = (magnitude >> 13) & 1u;
  magnitude += (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu + mantissa_odd;
  return sign | static_cast<uint16_t>(magnitude >> 13);
}

inline float BF16ToFloat(uint16_t bf16) { return std::bit_cast<float>(static_cast<uint32_t>(bf16) << 16); }

inline uint16_t FloatToBF16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);  // keep NaN a NaN after truncation
  }
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

}  // namespace warmpool::safetensors
