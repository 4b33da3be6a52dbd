#include "engines/bf16_gemv.h"

#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <cstddef>

#include "engines/avx512_sum4.h"
#include "engines/gemv_blocks.h"

// GCC 12's AVX-512 intrinsics (_mm512_reduce_add_ps, and Sum4's casts and extracts) pass
// `_mm256_undefined_*()`, a self-initialised variable, as the unused merge operand, and GCC 12
// reports it wherever they are inlined (GCC bug 105593, fixed in GCC 13). Nothing here reads an
// uninitialised value.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

namespace warmpool::dense {
namespace {

#define WARMPOOL_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512bf16")))

// Up to eight rows in one pass over a block's weights, so that the weights come from memory once
// for all of them while the arithmetic runs (a step of eight sequences in the transformer engine
// runs here). Four outputs at a time for up to four rows: each input vector loaded feeds four dot
// products, and a single row has four independent accumulation chains. Three for five to eight
// rows: at most 24 accumulators, 3 weight vectors and an input of the 32 registers. (Two outputs x
// 8 rows ran 40% longer, and four x 4 rows in two chunks, the second from the L1 cache, 10%.)
constexpr uint32_t kRowsPerPass = 8;
template <uint32_t R>
inline constexpr uint32_t kGroupOutputs = R <= 4 ? 4 : 3;
// Weights are prefetched this many groups ahead, into the L2 cache: a group's rows span pages, and
// the hardware's stream prefetchers stop at a page's end, so that without it every group began with
// misses. Into L2 rather than L1 (prefetcht1), which keeps the L1's miss buffers for the loads: the
// products of a 256 MiB model's layers took, on a 2-core EPYC VM, at 1 and 8 rows, 10.5-11 and
// 12.5-15 ms so, 16.5-19 and 20-23 ms prefetching into L1, and 30-33 ms at 8 rows without.
constexpr uint32_t kAheadGroups = 3;

WARMPOOL_BF16_TARGET inline __m512bh Load32(const void* p) {
  return reinterpret_cast<__m512bh>(_mm512_loadu_si512(p));
}

// The last in % 32 elements; lanes past the end are zeros and are never read from memory.
WARMPOOL_BF16_TARGET inline __m512bh LoadTail(const void* p, __mmask32 mask) {
  return reinterpret_cast<__m512bh>(_mm512_maskz_loadu_epi16(mask, p));
}

// N outputs (weight rows `rows`) x C input rows from x: y[r * out + j] for r < C, j < N. With
// `ahead`, each weight line is prefetched that many bytes further on.
template <uint32_t N, uint32_t C>
WARMPOOL_BF16_TARGET void Chunk(const uint8_t* const* rows, uint32_t in, uint32_t out, const uint16_t* x,
                                const float* bias, float* y, size_t ahead) {
  constexpr uint32_t kAccumulators = N * C;
  const uint32_t whole = in / 32 * 32;
  const auto tail = static_cast<__mmask32>((uint64_t{1} << (in - whole)) - 1);
  __m512 acc[kAccumulators];  // row r, output j at r * N + j
  for (uint32_t i = 0; i < kAccumulators; ++i) acc[i] = _mm512_setzero_ps();
  for (uint32_t k = 0; k < whole; k += 32) {
    __m512bh w[N];
    for (uint32_t j = 0; j < N; ++j) {
      w[j] = Load32(rows[j] + 2 * k);
      if (ahead != 0) _mm_prefetch(reinterpret_cast<const char*>(rows[j] + 2 * k + ahead), _MM_HINT_T1);
    }
    for (uint32_t r = 0; r < C; ++r) {
      const __m512bh xv = Load32(x + size_t{r} * in + k);
      for (uint32_t j = 0; j < N; ++j) acc[r * N + j] = _mm512_dpbf16_ps(acc[r * N + j], w[j], xv);
    }
  }
  if (tail != 0) {
    __m512bh w[N];
    for (uint32_t j = 0; j < N; ++j) w[j] = LoadTail(rows[j] + 2 * whole, tail);
    for (uint32_t r = 0; r < C; ++r) {
      const __m512bh xv = LoadTail(x + size_t{r} * in + whole, tail);
      for (uint32_t j = 0; j < N; ++j) acc[r * N + j] = _mm512_dpbf16_ps(acc[r * N + j], w[j], xv);
    }
  }
  // Every accumulator summed by the same tree, the last ones beside zeros: a vector's sum in Sum4
  // does not depend on the other three, so a row's outputs are the same bits whatever the rows
  // and outputs taken with it (a sequence's decode step alone or in a batch).
  alignas(16) float sums[(kAccumulators + 3) / 4 * 4];
  for (uint32_t i = 0; i < kAccumulators; i += 4) {
    const __m512 zero = _mm512_setzero_ps();
    _mm_store_ps(sums + i, simd::Sum4(acc[i], i + 1 < kAccumulators ? acc[i + 1] : zero,
                                      i + 2 < kAccumulators ? acc[i + 2] : zero,
                                      i + 3 < kAccumulators ? acc[i + 3] : zero));
  }
  for (uint32_t r = 0; r < C; ++r) {
    for (uint32_t j = 0; j < N; ++j) {
      y[size_t{r} * out + j] = sums[r * N + j] + (bias != nullptr ? bias[j] : 0.0f);
    }
  }
}

// Outputs n_begin to n_end for R rows: in groups, prefetching ahead, then the last few one at a time.
template <uint32_t R>
WARMPOOL_BF16_TARGET void Pass(const uint8_t* weight, uint32_t in, uint32_t out, uint32_t n_begin, uint32_t n_end,
                               const uint16_t* x, const float* bias, float* y) {
  constexpr uint32_t kGroup = kGroupOutputs<R>;
  const size_t ahead = size_t{kAheadGroups} * kGroup * in * 2;
  uint32_t n = n_begin;
  for (; n + kGroup <= n_end; n += kGroup) {
    const uint8_t* rows[kGroup];
    for (uint32_t j = 0; j < kGroup; ++j) rows[j] = weight + size_t{n + j} * in * 2;
    Chunk<kGroup, R>(rows, in, out, x, bias != nullptr ? bias + n : nullptr, y + n, ahead);
  }
  for (; n < n_end; ++n) {
    const uint8_t* row = weight + size_t{n} * in * 2;
    Chunk<1, R>(&row, in, out, x, bias != nullptr ? bias + n : nullptr, y + n, 0);
  }
}

using PassFn = void (*)(const uint8_t*, uint32_t, uint32_t, uint32_t, uint32_t, const uint16_t*, const float*, float*);
constexpr PassFn kPasses[kRowsPerPass] = {&Pass<1>, &Pass<2>, &Pass<3>, &Pass<4>,
                                          &Pass<5>, &Pass<6>, &Pass<7>, &Pass<8>};

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

WARMPOOL_BF16_TARGET void NarrowToBF16(const float* in, uint64_t count, uint16_t* out) {
  uint64_t i = 0;
  for (; i + 32 <= count; i += 32) {
    const __m512bh pair = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(in + i + 16), _mm512_loadu_ps(in + i));
    _mm512_storeu_si512(out + i, reinterpret_cast<__m512i>(pair));
  }
  if (i < count) {
    const auto low = static_cast<__mmask16>((uint32_t{1} << std::min<uint64_t>(16, count - i)) - 1);
    const auto high = static_cast<__mmask16>(count - i > 16 ? (uint32_t{1} << (count - i - 16)) - 1 : 0);
    const __m512bh pair =
        _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(high, in + i + 16), _mm512_maskz_loadu_ps(low, in + i));
    _mm512_mask_storeu_epi16(out + i, static_cast<__mmask32>((uint64_t{1} << (count - i)) - 1),
                             reinterpret_cast<__m512i>(pair));
  }
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
