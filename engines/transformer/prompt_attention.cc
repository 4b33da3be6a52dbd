#include "engines/transformer/prompt_attention.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <atomic>
#include <cmath>
#include <vector>

#include <dnnl.h>

#include "engines/transformer/vector_exp.h"

// GCC 12's AVX-512 intrinsics pass `_mm256_undefined_*()`, a self-initialised variable, as the
// unused merge operand of their reductions, and report it wherever they are inlined (GCC bug
// 105593, fixed in GCC 13). Nothing here reads an uninitialised value.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

namespace warmpool::transformer {

namespace {

// Rows per task: the keys and values a tile sees are widened once (a bf16 cache) for all its rows.
constexpr uint32_t kTileRows = 64;
// Query vectors per product (rows times query heads): their scores are as many rows of the
// positions they see (8 MiB at 32k positions).
constexpr uint32_t kChunkQueries = 64;

// Whether `count` rows of `width` floats, `stride` apart, are all finite: x * 0 is 0 for every
// finite x and NaN for an infinity or a NaN, so the sum stays 0 exactly when all are (a loop the
// compiler vectorises, unlike one of std::isfinite).
bool Finite(const float* x, uint32_t count, uint32_t width, uint64_t stride) {
  float sum = 0;
  for (uint32_t r = 0; r < count; ++r) {
    const float* row = x + r * stride;
#pragma omp simd reduction(+ : sum)
    for (uint32_t i = 0; i < width; ++i) sum += row[i] * 0.0f;
  }
  return sum == 0.0f;
}

// The first position a token at `position` sees: 0, or the start of its sliding window (which
// counts the token itself).
uint32_t FirstVisible(const Config& c, uint32_t position) {
  return c.sliding_window != 0 && position + 1 > c.sliding_window ? static_cast<uint32_t>(position + 1 - c.sliding_window)
                                                                   : 0;
}

// `count` rows of `width` bf16 elements, `stride` apart, widened into rows of `width` floats, one
// after another (exactly: a bf16 is the upper half of the f32 it stands for).
void WidenRows(const uint16_t* x, uint32_t count, uint32_t width, uint64_t stride, float* out) {
  for (uint32_t r = 0; r < count; ++r) {
    const uint16_t* row = x + r * stride;
    float* to = out + uint64_t{r} * width;
#pragma omp simd
    for (uint32_t i = 0; i < width; ++i) to[i] = std::bit_cast<float>(uint32_t{row[i]} << 16);
  }
}

}  // namespace

namespace {

// Softmax in AVX-512 (the scores of every head of every layer go through it: a fifth of a
// 128-token piece's step at position 2000 went to the loops below, which GCC leaves scalar or in
// SSE). The maximum is exact and the differences and quotients are rounded once per element, so
// those are the same bits in any order; the sum's order differs from the loops below, and so the
// quotients' last bits with it. (A NaN
// among the scores may or may not become the maximum, but either way it makes the sum and so
// every quotient NaN, as in the loops.)
__attribute__((target("avx512f"))) void SoftmaxAvx512(float* x, uint32_t n) {
  constexpr uint32_t kLanes = 16;
  const uint32_t body = n / kLanes * kLanes;
  const __mmask16 tail = static_cast<__mmask16>((1u << (n - body)) - 1);
  __m512 max = _mm512_set1_ps(-INFINITY);
  for (uint32_t j = 0; j < body; j += kLanes) max = _mm512_max_ps(max, _mm512_loadu_ps(x + j));
  max = _mm512_max_ps(max, _mm512_mask_loadu_ps(max, tail, x + body));
  const __m512 most = _mm512_set1_ps(_mm512_reduce_max_ps(max));
  for (uint32_t j = 0; j < body; j += kLanes) _mm512_storeu_ps(x + j, _mm512_sub_ps(_mm512_loadu_ps(x + j), most));
  _mm512_mask_storeu_ps(x + body, tail, _mm512_sub_ps(_mm512_maskz_loadu_ps(tail, x + body), most));
  ExpInPlace(x, n);
  __m512 sum = _mm512_maskz_loadu_ps(tail, x + body);
  for (uint32_t j = 0; j < body; j += kLanes) sum = _mm512_add_ps(sum, _mm512_loadu_ps(x + j));
  const __m512 total = _mm512_set1_ps(_mm512_reduce_add_ps(sum));
  for (uint32_t j = 0; j < body; j += kLanes) _mm512_storeu_ps(x + j, _mm512_div_ps(_mm512_loadu_ps(x + j), total));
  _mm512_mask_storeu_ps(x + body, tail, _mm512_div_ps(_mm512_maskz_loadu_ps(tail, x + body), total));
}

}  // namespace

void Softmax(float* x, uint32_t n) {
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  if (avx512) return SoftmaxAvx512(x, n);
  SoftmaxLoops(x, n);
}

void SoftmaxLoops(float* x, uint32_t n) {
  float max = -INFINITY;
  for (uint32_t j = 0; j < n; ++j) max = std::max(max, x[j]);
#pragma omp simd
  for (uint32_t j = 0; j < n; ++j) x[j] -= max;
  ExpInPlace(x, n);
  float total = 0;
#pragma omp simd reduction(+ : total)
  for (uint32_t j = 0; j < n; ++j) total += x[j];
#pragma omp simd
  for (uint32_t j = 0; j < n; ++j) x[j] /= total;
}

Status PromptAttention(const Config& c, uint32_t layer, uint32_t rows, uint32_t start, KvCache& cache,
                       const float* q, float* out, int threads) {
  if (rows == 0) return OkStatus();
  const uint32_t group = c.num_attention_heads / c.num_key_value_heads;
  const uint32_t d = c.head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const uint32_t tiles = (rows + kTileRows - 1) / kTileRows;
  // A task is a tile and a KV head's query heads, or a part of them where there would be fewer
  // tasks than threads (a short piece of a model with few KV heads).
  const uint32_t tile_heads = tiles * c.num_key_value_heads;
  const uint32_t parts = std::clamp<uint32_t>((static_cast<uint32_t>(threads) + tile_heads - 1) / tile_heads, 1, group);
  const int64_t tasks = int64_t{tile_heads} * parts;
  std::atomic<int> failed{dnnl_success};
  // Later tiles see more keys: dynamic, so that the threads finish together. Inside the parallel
  // loop oneDNN runs each product on the calling thread.
#pragma omp parallel for num_threads(threads) schedule(dynamic)
  for (int64_t task = 0; task < tasks; ++task) {
    const auto part = static_cast<uint32_t>(task % parts);
    const auto g = static_cast<uint32_t>(task / parts % c.num_key_value_heads);
    const auto r0 = static_cast<uint32_t>(task / parts / c.num_key_value_heads) * kTileRows;
    const uint32_t n = std::min(kTileRows, rows - r0);
    const uint32_t h0 = g * group + part * group / parts;  // the task's first query head
    const uint32_t heads = g * group + (part + 1) * group / parts - h0;
    // The keys any row of the tile may see: from the first row's window start to the last row.
    const uint32_t end = start + r0 + n;  // exclusive
    const uint32_t lo = FirstVisible(c, start + r0);
    const uint32_t width = end - lo;
    const uint64_t head = uint64_t{g} * d;  // the KV head's place in a position's row
    // The keys and values the tile sees, a block's run at a time, kv_size elements apart in the
    // cache; a bf16 cache's widened first, the KV head's alone, into one run of head_dim floats
    // apart (oneDNN's products here take f32), once for all the task's query heads.
    const bool widened = cache.element() == KvElement::kBF16;
    thread_local std::vector<float> wide_keys, wide_values;
    if (widened) {
      wide_keys.resize(uint64_t{width} * d);
      wide_values.resize(wide_keys.size());
      for (uint32_t p = lo; p < end;) {
        const uint32_t span = KvCache::Contiguous(p, end);
        const uint64_t at = uint64_t{p - lo} * d;
        WidenRows(cache.key_bf16(layer, p) + head, span, d, c.kv_size(), wide_keys.data() + at);
        WidenRows(cache.value_bf16(layer, p) + head, span, d, c.kv_size(), wide_values.data() + at);
        p += span;
      }
    }
    const uint64_t ld = widened ? d : c.kv_size();
    auto key_at = [&](uint32_t p) -> const float* {
      return widened ? wide_keys.data() + uint64_t{p - lo} * d : cache.key(layer, p) + head;
    };
    auto value_at = [&](uint32_t p) -> const float* {
      return widened ? wide_values.data() + uint64_t{p - lo} * d : cache.value(layer, p) + head;
    };
    bool finite = true;
    for (uint32_t p = lo; p < end && finite;) {
      const uint32_t span = widened ? end - p : KvCache::Contiguous(p, end);
      finite = Finite(value_at(p), span, d, ld);
      p += span;
    }
    // The task's query heads of a chunk of the tile's rows are one product's rows, row by row and
    // head by head within it (query m is row m / heads's head m % heads): a short piece's rows,
    // times the heads that share a KV head, instead of a product per head of a few rows each.
    const uint32_t chunk_rows = std::max(1u, kChunkQueries / heads);
    thread_local std::vector<float> queries, scores, attended;
    dnnl_status_t s = dnnl_success;
    for (uint32_t i0 = 0; i0 < n && s == dnnl_success; i0 += chunk_rows) {
      const uint32_t m_rows = std::min(chunk_rows, n - i0);
      const uint32_t m = m_rows * heads;
      const uint32_t first_row = start + r0 + i0;
      const uint32_t chunk_lo = FirstVisible(c, first_row), chunk_end = first_row + m_rows;
      const uint32_t chunk_width = chunk_end - chunk_lo;
      auto span_at = [&](uint32_t p) { return widened ? chunk_end - p : KvCache::Contiguous(p, chunk_end); };
      queries.resize(uint64_t{m} * d);
      for (uint32_t i = 0; i < m_rows; ++i) {
        std::copy_n(q + uint64_t{r0 + i0 + i} * c.q_size() + uint64_t{h0} * d, uint64_t{heads} * d,
                    queries.data() + uint64_t{i} * heads * d);
      }
      // Q·Kᵀ a run at a time, each run's scores a band of columns.
      scores.resize(uint64_t{m} * chunk_width);
      for (uint32_t p = chunk_lo; p < chunk_end && s == dnnl_success;) {
        const uint32_t span = span_at(p);
        s = dnnl_sgemm('N', 'T', m, span, d, scale, queries.data(), d, key_at(p), ld, 0.0f,
                       scores.data() + (p - chunk_lo), chunk_width);
        p += span;
      }
      for (uint32_t j = 0; j < m && s == dnnl_success; ++j) {
        // Its row sees positions first .. position (causal, and within the window, which counts
        // the token itself); the rest of its scores weigh nothing.
        const uint32_t position = first_row + j / heads;
        const uint32_t a = FirstVisible(c, position) - chunk_lo, b = position - chunk_lo + 1;
        float* row = scores.data() + uint64_t{j} * chunk_width;
        Softmax(row + a, b - a);
        std::fill(row, row + a, 0.0f);
        std::fill(row + b, row + chunk_width, 0.0f);
      }
      attended.assign(uint64_t{m} * d, 0.0f);
      if (s == dnnl_success && finite) {
        // P·V, the blocks' products summed into the output.
        for (uint32_t p = chunk_lo; p < chunk_end && s == dnnl_success;) {
          const uint32_t span = span_at(p);
          s = dnnl_sgemm('N', 'N', m, d, span, 1.0f, scores.data() + (p - chunk_lo), chunk_width, value_at(p), ld,
                         p == chunk_lo ? 0.0f : 1.0f, attended.data(), d);
          p += span;
        }
      } else if (s == dnnl_success) {
        // A value that is not finite must reach only the rows that see it: as a product, the zero
        // weight of a row that does not would make 0 x inf = NaN of it. Row by row, over exactly
        // what each sees, as the decode loop weighs them.
        for (uint32_t j = 0; j < m; ++j) {
          const uint32_t position = first_row + j / heads;
          const float* weights = scores.data() + uint64_t{j} * chunk_width;
          float* row_out = attended.data() + uint64_t{j} * d;
          for (uint32_t k = FirstVisible(c, position); k <= position; ++k) {
            const float* v = value_at(k);
            for (uint32_t e = 0; e < d; ++e) row_out[e] += weights[k - chunk_lo] * v[e];
          }
        }
      }
      for (uint32_t i = 0; i < m_rows; ++i) {
        std::copy_n(attended.data() + uint64_t{i} * heads * d, uint64_t{heads} * d,
                    out + uint64_t{r0 + i0 + i} * c.q_size() + uint64_t{h0} * d);
      }
    }
    if (s != dnnl_success) failed = s;
  }
  if (failed != dnnl_success) return Error(Code::kInternal, "oneDNN refused an attention product (status {})", failed.load());
  return OkStatus();
}

}  // namespace warmpool::transformer
