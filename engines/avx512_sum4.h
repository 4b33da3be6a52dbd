// The sums of four AVX-512 vectors' lanes at once, for the small-batch kernels that end with many
// dot products (bf16_gemv.cc, transformer/decode_attention.cc). A file including this compiles it
// for AVX-512F (the function's own target) and must call it only where the CPU has AVX-512F; on
// GCC 12 it must silence -Wuninitialized and -Wmaybe-uninitialized, which the intrinsics' casts
// and extracts trip wherever they are inlined (GCC bug 105593).
#pragma once

#include <immintrin.h>

namespace warmpool::simd {

// [Σa, Σb, Σc, Σd] over the 16 lanes of each: a transposing tree that adds lanes of different
// vectors together, 13 instructions where four separate reductions take 32.
__attribute__((target("avx512f"))) inline __m128 Sum4(__m512 a, __m512 b, __m512 c, __m512 d) {
  // In each 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3] and the same of c and d.
  const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
  const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
  // In each lane: a, b, c and d, each summed over the lane.
  const __m512 lanes = _mm512_add_ps(_mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(1, 0, 1, 0)),
                                     _mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(3, 2, 3, 2)));
  // The four lanes added together.
  const __m256 halves = _mm256_add_ps(_mm512_castps512_ps256(lanes),
                                      _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(lanes), 1)));
  return _mm_add_ps(_mm256_castps256_ps128(halves), _mm256_extractf128_ps(halves, 1));
}

}  // namespace warmpool::simd
