#include "engines/bf16_gemv.h"

#include <cpuid.h>
#include <immintrin.h>

#include <cstddef>

#include "engines/gemv_blocks.h"

// GCC 12's AVX-512 intrinsics (_mm512_reduce_add_ps, _mm512_cvtph_ps) pass `_mm256_undefined_*()`,
// a self-initialised variable, as the unused merge operand, and GCC 12 reports it wherever they
// are inlined (GCC bug 105593, fixed in GCC 13). Nothing here reads an uninitialised value.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace warmpool::dense {
namespace {

#define WARMPOOL_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512bf16")))

// Four outputs at once, so that each input vector loaded feeds four dot products and a single
// row has four independent accumulation chains; up to 4 rows x 4 outputs = 16 accumulators of
// the 32 registers.
constexpr uint32_t kRowsPerPass = 4;

WARMPOOL_BF16_TARGET inline __m512bh Load32(const void* p) {
  return reinterpret_cast<__m512bh>(_mm512_loadu_si512(p));
}

// The last in % 32 elements; lanes past the end are zeros and are never read from memory.
WARMPOOL_BF16_TARGET inline __m512bh LoadTail(const void* p, __mmask32 mask) {
  return reinterpret_cast<__m512bh>(_mm512_maskz_loadu_epi16(mask, p));
}

template <uint32_t N, uint32_t R>
WARMPOOL_BF16_TARGET void Pass(const uint8_t* weight, uint32_t in, uint32_t out, uint32_t n_begin, uint32_t n_end,
                               const uint16_t* x, const float* bias, float* y) {
  const uint32_t whole = in / 32 * 32;
  const auto tail = static_cast<__mmask32>((uint64_t{1} << (in - whole)) - 1);
  for (uint32_t n = n_begin; n + N <= n_end; n += N) {
    const uint8_t* rows[N];
    for (uint32_t j = 0; j < N; ++j) rows[j] = weight + size_t{n + j} * in * 2;
    __m512 acc[N][R];
    for (uint32_t j = 0; j < N; ++j) {
      for (uint32_t r = 0; r < R; ++r) acc[j][r] = _mm512_setzero_ps();
    }
    for (uint32_t k = 0; k < whole; k += 32) {
      __m512bh w[N];
      for (uint32_t j = 0; j < N; ++j) w[j] = Load32(rows[j] + 2 * k);
      for (uint32_t r = 0; r < R; ++r) {
        const __m512bh xv = Load32(x + size_t{r} * in + k);
        for (uint32_t j = 0; j < N; ++j) acc[j][r] = _mm512_dpbf16_ps(acc[j][r], w[j], xv);
      }
    }
    if (tail != 0) {
      __m512bh w[N];
      for (uint32_t j = 0; j < N; ++j) w[j] = LoadTail(rows[j] + 2 * whole, tail);
      for (uint32_t r = 0; r < R; ++r) {
        const __m512bh xv = LoadTail(x + size_t{r} * in + whole, tail);
        for (uint32_t j = 0; j < N; ++j) acc[j][r] = _mm512_dpbf16_ps(acc[j][r], w[j], xv);
      }
    }
    for (uint32_t j = 0; j < N; ++j) {
      for (uint32_t r = 0; r < R; ++r) {
        y[size_t{r} * out + n + j] = _mm512_reduce_add_ps(acc[j][r]) + (bias != nullptr ? bias[n + j] : 0.0f);
      }
    }
  }
}

// Outputs in fours, then the last one to three one at a time.
template <uint32_t R>
WARMPOOL_BF16_TARGET void PassOutputs(const uint8_t* weight, uint32_t in, uint32_t out, uint32_t n_begin,
                                      uint32_t n_end, const uint16_t* x, const float* bias, float* y) {
  const uint32_t fours_end = n_begin + (n_end - n_begin) / 4 * 4;
  Pass<4, R>(weight, in, out, n_begin, fours_end, x, bias, y);
  Pass<1, R>(weight, in, out, fours_end, n_end, x, bias, y);
}

using PassFn = void (*)(const uint8_t*, uint32_t, uint32_t, uint32_t, uint32_t, const uint16_t*, const float*, float*);
constexpr PassFn kPasses[kRowsPerPass] = {&PassOutputs<1>, &PassOutputs<2>, &PassOutputs<3>, &PassOutputs<4>};

// AVX512_BF16 is CPUID leaf 7, sub-leaf 1, EAX bit 5 (GCC 12 and clang 14 differ in what
// __builtin_cpu_supports knows; the AVX-512F check also says that the OS saves the registers).
bool HaveAvx512Bf16Bit() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) != 0 && (eax & (1u << 5)) != 0;
}

}  // namespace

bool HaveBF16Gemv() {
  static const bool have =
      __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && HaveAvx512Bf16Bit();
  return have;
}

void BF16Gemv(const uint8_t* weight, uint32_t in, uint32_t out, const uint16_t* input, uint32_t rows,
              const float* bias, float* output, int threads) {
  ForEachGemvBlock(in, out, rows, kRowsPerPass, 2, threads,
                   [&](uint32_t n_begin, uint32_t n_end, uint32_t first, uint32_t count) {
                     kPasses[count - 1](weight, in, out, n_begin, n_end, input + size_t{first} * in, bias,
                                        output + size_t{first} * out);
                   });
}

}  // namespace warmpool::dense
