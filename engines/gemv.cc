#include "engines/gemv.h"

#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstring>

#include "engines/gemv_blocks.h"
#include "engines/half.h"

// GCC 12's AVX-512 intrinsics (_mm512_reduce_add_ps, _mm512_cvtph_ps) pass `_mm256_undefined_*()`,
// a self-initialised variable, as the unused merge operand, and GCC 12 reports it wherever they
// are inlined (GCC bug 105593, fixed in GCC 13). Nothing here reads an uninitialised value.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace warmpool::dense {
namespace {

#define WARMPOOL_F16_TARGET __attribute__((target("avx2,fma,f16c")))

// Rows per pass: up to 4 rows x 2 accumulators (two independent FMA chains per row, which a single
// row needs to keep up with memory) fit the 16 AVX2 registers with the loads. Always two chains,
// so that a row's sums are the same bits whatever rows share its call (a sequence's decode step
// alone or in a batch); 8 rows x 1 chain in one pass summed rows 5 to 8 in another order.
constexpr uint32_t kRowsPerPass = 4;

WARMPOOL_F16_TARGET inline float HorizontalSum(__m256 v) {
  __m128 sum = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  sum = _mm_hadd_ps(sum, sum);
  sum = _mm_hadd_ps(sum, sum);
  return _mm_cvtss_f32(sum);
}

WARMPOOL_F16_TARGET inline __m256 LoadHalves(const uint8_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

template <uint32_t R>
WARMPOOL_F16_TARGET void Pass(const uint8_t* weight, uint32_t in, uint32_t out, uint32_t n_begin, uint32_t n_end,
                              const float* x, const float* bias, float* y) {
  constexpr uint32_t kUnroll = 2;
  for (uint32_t n = n_begin; n < n_end; ++n) {
    const uint8_t* row = weight + size_t{n} * in * 2;
    __m256 acc[kUnroll][R];
    for (uint32_t u = 0; u < kUnroll; ++u) {
      for (uint32_t r = 0; r < R; ++r) acc[u][r] = _mm256_setzero_ps();
    }
    uint32_t k = 0;
    for (; k + 8 * kUnroll <= in; k += 8 * kUnroll) {
      for (uint32_t u = 0; u < kUnroll; ++u) {
        const __m256 w = LoadHalves(row + 2 * (k + 8 * u));
        for (uint32_t r = 0; r < R; ++r) {
          acc[u][r] = _mm256_fmadd_ps(w, _mm256_loadu_ps(x + size_t{r} * in + k + 8 * u), acc[u][r]);
        }
      }
    }
    for (; k + 8 <= in; k += 8) {
      const __m256 w = LoadHalves(row + 2 * k);
      for (uint32_t r = 0; r < R; ++r) acc[0][r] = _mm256_fmadd_ps(w, _mm256_loadu_ps(x + size_t{r} * in + k), acc[0][r]);
    }
    for (uint32_t r = 0; r < R; ++r) {
      __m256 total = acc[0][r];
      total = _mm256_add_ps(total, acc[1][r]);
      float sum = HorizontalSum(total);
      for (uint32_t t = k; t < in; ++t) {
        uint16_t bits;
        std::memcpy(&bits, row + 2 * t, 2);
        sum += safetensors::HalfToFloat(bits) * x[size_t{r} * in + t];
      }
      y[size_t{r} * out + n] = sum + (bias != nullptr ? bias[n] : 0.0f);
    }
  }
}

using PassFn = void (*)(const uint8_t*, uint32_t, uint32_t, uint32_t, uint32_t, const float*, const float*, float*);
constexpr PassFn kPasses[kRowsPerPass] = {&Pass<1>, &Pass<2>, &Pass<3>, &Pass<4>};

// AVX-512: 16 weights per load (and conversion), and four outputs at once so that each input
// vector loaded feeds four FMAs (one per output) and a single row still has four independent FMA
// chains. Up to 4 rows x 4 outputs = 16 accumulators of the 32 registers. The same passes serve
// f16 weights (converted in registers) and f32 ones.
#define WARMPOOL_F16_TARGET_512 __attribute__((target("avx512f,fma,f16c")))
constexpr uint32_t kRowsPerPass512 = 4;

struct HalfWeights {
  static constexpr size_t kBytes = 2;
  WARMPOOL_F16_TARGET_512 static __m512 Load16(const uint8_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static float At(const uint8_t* p) {
    uint16_t bits;
    std::memcpy(&bits, p, 2);
    return safetensors::HalfToFloat(bits);
  }
};

struct FloatWeights {
  static constexpr size_t kBytes = 4;
  WARMPOOL_F16_TARGET_512 static __m512 Load16(const uint8_t* p) { return _mm512_loadu_ps(p); }
  static float At(const uint8_t* p) {
    float value;
    std::memcpy(&value, p, 4);
    return value;
  }
};

template <typename W, uint32_t N, uint32_t R>
WARMPOOL_F16_TARGET_512 void Pass512(const uint8_t* weight, uint32_t in, uint32_t out, uint32_t n_begin,
                                     uint32_t n_end, const float* x, const float* bias, float* y) {
  for (uint32_t n = n_begin; n + N <= n_end; n += N) {
    const uint8_t* rows[N];
    for (uint32_t j = 0; j < N; ++j) rows[j] = weight + size_t{n + j} * in * W::kBytes;
    __m512 acc[N][R];
    for (uint32_t j = 0; j < N; ++j) {
      for (uint32_t r = 0; r < R; ++r) acc[j][r] = _mm512_setzero_ps();
    }
    uint32_t k = 0;
    // Two vectors of each output's weights per step: a whole cache line of f16 weights per stream.
    for (; k + 32 <= in; k += 32) {
      __m512 w[N], v[N];
      for (uint32_t j = 0; j < N; ++j) {
        w[j] = W::Load16(rows[j] + W::kBytes * k);
        v[j] = W::Load16(rows[j] + W::kBytes * (k + 16));
      }
      for (uint32_t r = 0; r < R; ++r) {
        const __m512 xv = _mm512_loadu_ps(x + size_t{r} * in + k);
        const __m512 xu = _mm512_loadu_ps(x + size_t{r} * in + k + 16);
        for (uint32_t j = 0; j < N; ++j) acc[j][r] = _mm512_fmadd_ps(v[j], xu, _mm512_fmadd_ps(w[j], xv, acc[j][r]));
      }
    }
    for (; k + 16 <= in; k += 16) {
      __m512 w[N];
      for (uint32_t j = 0; j < N; ++j) w[j] = W::Load16(rows[j] + W::kBytes * k);
      for (uint32_t r = 0; r < R; ++r) {
        const __m512 xv = _mm512_loadu_ps(x + size_t{r} * in + k);
        for (uint32_t j = 0; j < N; ++j) acc[j][r] = _mm512_fmadd_ps(w[j], xv, acc[j][r]);
      }
    }
    for (uint32_t j = 0; j < N; ++j) {
      for (uint32_t r = 0; r < R; ++r) {
        float sum = _mm512_reduce_add_ps(acc[j][r]);
        for (uint32_t t = k; t < in; ++t) sum += W::At(rows[j] + W::kBytes * t) * x[size_t{r} * in + t];
        y[size_t{r} * out + n + j] = sum + (bias != nullptr ? bias[n + j] : 0.0f);
      }
    }
  }
}

// Outputs in fours, then the last one to three one at a time.
template <typename W, uint32_t R>
WARMPOOL_F16_TARGET_512 void Pass512Outputs(const uint8_t* weight, uint32_t in, uint32_t out, uint32_t n_begin,
                                            uint32_t n_end, const float* x, const float* bias, float* y) {
  const uint32_t fours_end = n_begin + (n_end - n_begin) / 4 * 4;
  Pass512<W, 4, R>(weight, in, out, n_begin, fours_end, x, bias, y);
  Pass512<W, 1, R>(weight, in, out, fours_end, n_end, x, bias, y);
}

template <typename W>
constexpr PassFn kPasses512[kRowsPerPass512] = {&Pass512Outputs<W, 1>, &Pass512Outputs<W, 2>,
                                                &Pass512Outputs<W, 3>, &Pass512Outputs<W, 4>};

// F16C from CPUID itself: clang 14's __builtin_cpu_supports does not know "f16c". (The AVX
// checks below also say that the OS saves the vector registers, which F16C needs too.)
bool HaveF16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
}

bool HaveAvx512() {
  static const bool have = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma") && HaveF16c();
  return have;
}

bool HaveAvx2() {
  static const bool have = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && HaveF16c();
  return have;
}

}  // namespace

WARMPOOL_F16_TARGET void WidenAvx2(const uint8_t* halves, uint64_t count, float* out) {
  uint64_t i = 0;
  for (; i + 8 <= count; i += 8) _mm256_storeu_ps(out + i, LoadHalves(halves + 2 * i));
  for (; i < count; ++i) {
    uint16_t bits;
    std::memcpy(&bits, halves + 2 * i, 2);
    out[i] = safetensors::HalfToFloat(bits);
  }
}

bool HaveF16Gemv() { return HaveAvx2() || HaveAvx512(); }

void WidenHalves(const uint8_t* halves, uint64_t count, float* out, int threads) {
  constexpr uint64_t kChunk = 1 << 16;
  const auto chunks = static_cast<int64_t>((count + kChunk - 1) / kChunk);
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    const uint64_t begin = static_cast<uint64_t>(c) * kChunk;
    WidenAvx2(halves + 2 * begin, std::min(kChunk, count - begin), out + begin);
  }
}

bool HaveF16Isa(F16Isa isa) { return isa == F16Isa::kAvx512 ? HaveAvx512() : HaveAvx2(); }

F16Isa BestF16Isa() { return HaveAvx512() ? F16Isa::kAvx512 : F16Isa::kAvx2; }

void F16Gemv(const uint8_t* weight, uint32_t in, uint32_t out, const float* input, uint32_t rows,
             const float* bias, float* output, int threads) {
  F16GemvOn(BestF16Isa(), weight, in, out, input, rows, bias, output, threads);
}

void F16GemvOn(F16Isa isa, const uint8_t* weight, uint32_t in, uint32_t out, const float* input, uint32_t rows,
               const float* bias, float* output, int threads) {
  const bool wide = isa == F16Isa::kAvx512;
  const PassFn* passes = wide ? kPasses512<HalfWeights> : kPasses;
  ForEachGemvBlock(in, out, rows, wide ? kRowsPerPass512 : kRowsPerPass, 2, threads,
                   [&](uint32_t n_begin, uint32_t n_end, uint32_t first, uint32_t count) {
                     passes[count - 1](weight, in, out, n_begin, n_end, input + size_t{first} * in, bias,
                                       output + size_t{first} * out);
                   });
}

bool HaveF32Gemv() { return HaveAvx512(); }

void F32Gemv(const uint8_t* weight, uint32_t in, uint32_t out, const float* input, uint32_t rows,
             const float* bias, float* output, int threads) {
  ForEachGemvBlock(in, out, rows, kRowsPerPass512, 4, threads,
                   [&](uint32_t n_begin, uint32_t n_end, uint32_t first, uint32_t count) {
                     kPasses512<FloatWeights>[count - 1](weight, in, out, n_begin, n_end,
                                                         input + size_t{first} * in, bias,
                                                         output + size_t{first} * out);
                   });
}

}  // namespace warmpool::dense
