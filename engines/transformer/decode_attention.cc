#include "engines/transformer/decode_attention.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <vector>

#include <dnnl.h>

#include "engines/avx512_sum4.h"
#include "engines/transformer/prompt_attention.h"

// GCC 12's AVX-512 intrinsics pass `_mm256_undefined_*()`, a self-initialised variable, as the
// unused merge operand of the casts and extracts, and report it wherever they are inlined (GCC bug
// 105593, fixed in GCC 13). Nothing here reads an uninitialised value.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

namespace warmpool::transformer {
namespace {

#define WARMPOOL_AVX512_TARGET __attribute__((target("avx512f")))

constexpr uint32_t kLanes = 16;
// Query heads whose dot products with one key are summed together by one Sum4.
constexpr uint32_t kQuad = 4;

// scores[(g - kv_first) * group + h][p] = scale · q[g * group + h] · key_p[g], position by position.
WARMPOOL_AVX512_TARGET void Scores(const AttentionShape& s, const float* q, std::span<const KvRun> runs,
                                   uint64_t stride, uint32_t kv_first, uint32_t kv_count, float* scores,
                                   uint64_t width) {
  const uint32_t group = s.heads / s.kv_heads;
  const uint32_t vectors = s.head_dim / kLanes;
  uint64_t position = 0;
  for (const KvRun& run : runs) {
    for (uint32_t i = 0; i < run.count; ++i, ++position) {
      const float* key = run.key + i * stride;
      for (uint32_t g = kv_first; g < kv_first + kv_count; ++g) {
        const float* head_key = key + uint64_t{g} * s.head_dim;
        for (uint32_t h0 = 0; h0 < group; h0 += kQuad) {
          const uint32_t quad = std::min(kQuad, group - h0);
          const float* queries = q + (uint64_t{g} * group + h0) * s.head_dim;
          __m512 acc[kQuad] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
          for (uint32_t v = 0; v < vectors; ++v) {
            const __m512 k = _mm512_loadu_ps(head_key + v * kLanes);
            for (uint32_t h = 0; h < quad; ++h) {
              acc[h] = _mm512_fmadd_ps(_mm512_loadu_ps(queries + uint64_t{h} * s.head_dim + v * kLanes), k, acc[h]);
            }
          }
          alignas(16) float sums[kQuad];
          _mm_store_ps(sums, _mm_mul_ps(simd::Sum4(acc[0], acc[1], acc[2], acc[3]), _mm_set1_ps(s.scale)));
          float* row = scores + (uint64_t{g - kv_first} * group + h0) * width + position;
          for (uint32_t h = 0; h < quad; ++h) row[h * width] = sums[h];
        }
      }
    }
  }
}

// out[g * group + h] = Σ_p weights[(g - kv_first) * group + h][p] · value_p[g], position by
// position; the sums stay in `out` (in the L1 cache: 16 heads of 64 are 4 KiB).
WARMPOOL_AVX512_TARGET void Weigh(const AttentionShape& s, const float* weights, std::span<const KvRun> runs,
                                  uint64_t stride, uint32_t kv_first, uint32_t kv_count, uint64_t width, float* out) {
  const uint32_t group = s.heads / s.kv_heads;
  const uint32_t vectors = s.head_dim / kLanes;
  float* const first_out = out + uint64_t{kv_first} * group * s.head_dim;
  std::fill(first_out, first_out + uint64_t{kv_count} * group * s.head_dim, 0.0f);
  uint64_t position = 0;
  for (const KvRun& run : runs) {
    for (uint32_t i = 0; i < run.count; ++i, ++position) {
      const float* value = run.value + i * stride;
      for (uint32_t g = kv_first; g < kv_first + kv_count; ++g) {
        const float* head_value = value + uint64_t{g} * s.head_dim;
        const float* head_weights = weights + uint64_t{g - kv_first} * group * width + position;
        float* head_out = out + uint64_t{g} * group * s.head_dim;
        for (uint32_t v = 0; v < vectors; ++v) {
          const __m512 values = _mm512_loadu_ps(head_value + v * kLanes);
          for (uint32_t h = 0; h < group; ++h) {
            float* o = head_out + uint64_t{h} * s.head_dim + v * kLanes;
            _mm512_storeu_ps(o, _mm512_fmadd_ps(_mm512_set1_ps(head_weights[h * width]), values, _mm512_loadu_ps(o)));
          }
        }
      }
    }
  }
}

}  // namespace

bool HaveAttendRuns(uint32_t head_dim) {
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  return avx512 && head_dim != 0 && head_dim % kLanes == 0;
}

void AttendRuns(const AttentionShape& shape, const float* q, std::span<const KvRun> runs, uint64_t stride,
                uint32_t kv_first, uint32_t kv_count, float* scores, float* out) {
  uint64_t width = 0;
  for (const KvRun& run : runs) width += run.count;
  Scores(shape, q, runs, stride, kv_first, kv_count, scores, width);
  const uint32_t rows = kv_count * (shape.heads / shape.kv_heads);
  for (uint32_t r = 0; r < rows; ++r) Softmax(scores + uint64_t{r} * width, static_cast<uint32_t>(width));
  Weigh(shape, scores, runs, stride, kv_first, kv_count, width, out);
}

namespace {

// The query heads sharing KV head g, against its keys and values a block at a time, on oneDNN.
dnnl_status_t AttendByProducts(const Config& c, uint32_t layer, KvCache& cache, uint32_t first, uint32_t end,
                               uint32_t g, const float* queries, float* scores, float* o) {
  const uint32_t group = c.num_attention_heads / c.num_key_value_heads;
  const uint32_t d = c.head_dim;
  const uint32_t count = end - first;
  const uint64_t head = uint64_t{g} * d;  // the KV head's place in a position's row
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  dnnl_status_t s = dnnl_success;
  for (uint32_t p = first; p < end && s == dnnl_success;) {
    const uint32_t span = KvCache::Contiguous(p, end);
    s = dnnl_sgemm('N', 'T', group, span, d, scale, queries, d, cache.key(layer, p) + head, c.kv_size(), 0.0f,
                   scores + (p - first), count);
    p += span;
  }
  for (uint32_t h = 0; h < group && s == dnnl_success; ++h) Softmax(scores + uint64_t{h} * count, count);
  for (uint32_t p = first; p < end && s == dnnl_success;) {
    const uint32_t span = KvCache::Contiguous(p, end);
    s = dnnl_sgemm('N', 'N', group, d, span, 1.0f, scores + (p - first), count, cache.value(layer, p) + head,
                   c.kv_size(), p == first ? 0.0f : 1.0f, o, d);
    p += span;
  }
  return s;
}

}  // namespace

Status DecodeAttention(const Config& c, uint32_t layer, uint32_t rows, uint32_t start, KvCache& cache, const float* q,
                       float* out, int threads) {
  const uint32_t group = c.num_attention_heads / c.num_key_value_heads;
  const uint32_t d = c.head_dim;
  const bool runs_here = HaveAttendRuns(d);
  // A task is a row's KV heads kv_first .. + kv_count: all of them (a row read in order) unless
  // there are more threads than rows to share them; on oneDNN, one KV head each.
  const uint32_t parts = runs_here ? std::clamp<uint32_t>((threads + rows - 1) / rows, 1, c.num_key_value_heads)
                                   : c.num_key_value_heads;
  const int64_t tasks = int64_t{rows} * parts;
  const AttentionShape shape{c.num_attention_heads, c.num_key_value_heads, d, 1.0f / std::sqrt(static_cast<float>(d))};
  std::atomic<int> failed{dnnl_success};
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t task = 0; task < tasks; ++task) {
    const auto r = static_cast<uint32_t>(task / parts);
    const auto part = static_cast<uint32_t>(task % parts);
    const uint32_t kv_first = part * c.num_key_value_heads / parts;
    const uint32_t kv_count = (part + 1) * c.num_key_value_heads / parts - kv_first;
    const uint32_t position = start + r;
    // Causal, and within the sliding window where the config has one (the window counts the
    // token itself).
    const uint32_t first = c.sliding_window != 0 && position + 1 > c.sliding_window
                               ? static_cast<uint32_t>(position + 1 - c.sliding_window)
                               : 0;
    const uint32_t end = position + 1;
    const float* row_q = q + uint64_t{r} * c.q_size();
    float* row_out = out + uint64_t{r} * c.q_size();
    thread_local std::vector<float> scores;
    scores.resize(uint64_t{kv_count} * group * (end - first));
    if (runs_here) {
      thread_local std::vector<KvRun> runs;
      runs.clear();
      for (uint32_t p = first; p < end;) {
        const uint32_t span = KvCache::Contiguous(p, end);
        runs.push_back({cache.key(layer, p), cache.value(layer, p), span});
        p += span;
      }
      AttendRuns(shape, row_q, runs, c.kv_size(), kv_first, kv_count, scores.data(), row_out);
      continue;
    }
    const uint64_t heads_at = uint64_t{kv_first} * group * d;
    const dnnl_status_t s =
        AttendByProducts(c, layer, cache, first, end, kv_first, row_q + heads_at, scores.data(), row_out + heads_at);
    if (s != dnnl_success) failed = s;
  }
  if (failed != dnnl_success) return Error(Code::kInternal, "oneDNN refused an attention product (status {})", failed.load());
  return OkStatus();
}

}  // namespace warmpool::transformer
