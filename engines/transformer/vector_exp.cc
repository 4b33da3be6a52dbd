#include "engines/transformer/vector_exp.h"

#include <bit>
#include <limits>

namespace warmpool::transformer {

// Cephes' expf, written so that the compiler vectorises it (no calls, no branches, no float-to-int
// conversion; this file is compiled without trapping math so that the selects are vector blends):
// exp(x) = 2^k exp(r), k = round(x / ln 2), r = x - k ln 2 in two parts (exactly representable
// high part, then the low), exp(r) by Cephes' degree-6 polynomial, and 2^k as two normal
// powers of two (k reaches -150 and 128, beyond one float's exponent range).
__attribute__((target_clones("avx512f", "avx2", "default")))
void ExpInPlace(float* x, uint64_t n) {
#pragma omp simd
  for (uint64_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float low = v < -104.0f ? -104.0f : v;  // a NaN passes both: it is put back at the end
    const float c = low > 88.8f ? 88.8f : low;
    const float shifted = c * 1.44269504088896341f + 12582912.0f;  // 1.5 x 2^23: its last bits are k
    const float kf = shifted - 12582912.0f;
    const int k = std::bit_cast<int>(shifted) - std::bit_cast<int>(12582912.0f);
    float r = c - kf * 0.693359375f;
    r = r - kf * -2.12194440e-4f;
    float y = 1.9875691500e-4f;
    y = y * r + 1.3981999507e-3f;
    y = y * r + 8.3334519073e-3f;
    y = y * r + 4.1665795894e-2f;
    y = y * r + 1.6666665459e-1f;
    y = y * r + 5.0000001201e-1f;
    y = y * (r * r) + r + 1.0f;
    const int half = k / 2;
    const float scale_a = std::bit_cast<float>(static_cast<uint32_t>(half + 127) << 23);
    const float scale_b = std::bit_cast<float>(static_cast<uint32_t>(k - half + 127) << 23);
    float out = y * scale_a * scale_b;
    out = v < -104.0f ? 0.0f : out;
    out = v > 88.7228391f ? std::numeric_limits<float>::infinity() : out;
    x[i] = v != v ? v : out;
  }
}

}  // namespace warmpool::transformer
