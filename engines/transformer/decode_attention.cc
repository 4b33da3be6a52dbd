#include "engines/transformer/decode_attention.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <type_traits>
#include <utility>
#include <vector>

#include <dnnl.h>

#include "engines/avx512_sum4.h"
#include "engines/bf16_gemv.h"
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
// Weigh's tiles: up to four query heads (of one KV head) by up to four of a head's 16-float
// vectors, whose sums stay in registers over a run's positions.
constexpr uint32_t kTile = 4;

// Sixteen elements of a key's or a value's row as floats: f32 loaded, bf16 widened (a bf16 is the
// upper half of the f32 it stands for, so widening is exact).
WARMPOOL_AVX512_TARGET inline __m512 Load16(const float* p) { return _mm512_loadu_ps(p); }
WARMPOOL_AVX512_TARGET inline __m512 Load16(const uint16_t* p) {
  const __m256i half = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
}

// out[h][v * 16 ..] (+)= Σ_i weights[h * width + position + i] · value_i[v * 16 ..] for the H heads
// and V vectors of a tile, over `count` positions whose values are at values, values + stride, ...
// (the tile's first vector in each position's row); out is the tile's first head's first vector,
// head_dim floats a head. `add`: out holds the sums of earlier positions.
template <uint32_t H, uint32_t V, class T>
WARMPOOL_AVX512_TARGET void WeighTile(const float* weights, uint64_t width, uint64_t position, const T* values,
                                      uint32_t count, uint64_t stride, uint32_t head_dim, bool add, float* out) {
  __m512 acc[H][V];
  for (uint32_t h = 0; h < H; ++h) {
    for (uint32_t v = 0; v < V; ++v) {
      acc[h][v] = add ? _mm512_loadu_ps(out + uint64_t{h} * head_dim + v * kLanes) : _mm512_setzero_ps();
    }
  }
  for (uint32_t i = 0; i < count; ++i) {
    __m512 value[V];
    for (uint32_t v = 0; v < V; ++v) value[v] = Load16(values + i * stride + v * kLanes);
    for (uint32_t h = 0; h < H; ++h) {
      const __m512 weight = _mm512_set1_ps(weights[h * width + position + i]);
      for (uint32_t v = 0; v < V; ++v) acc[h][v] = _mm512_fmadd_ps(weight, value[v], acc[h][v]);
    }
  }
  for (uint32_t h = 0; h < H; ++h) {
    for (uint32_t v = 0; v < V; ++v) _mm512_storeu_ps(out + uint64_t{h} * head_dim + v * kLanes, acc[h][v]);
  }
}

template <class T>
using WeighTileFn = void (*)(const float*, uint64_t, uint64_t, const T*, uint32_t, uint64_t, uint32_t, bool, float*);
template <uint32_t H, class T>
constexpr WeighTileFn<T> kWeighRow[kTile] = {&WeighTile<H, 1, T>, &WeighTile<H, 2, T>, &WeighTile<H, 3, T>,
                                             &WeighTile<H, 4, T>};
template <class T>
constexpr const WeighTileFn<T>* kWeighTiles[kTile] = {kWeighRow<1, T>, kWeighRow<2, T>, kWeighRow<3, T>,
                                                      kWeighRow<4, T>};

// scores[(g - kv_first) * group + h][p] = scale · q[g * group + h] · key_p[g], position by position,
// each position's row read once for all its KV heads, in order. (Tiles as Weigh's, a KV head at a
// time over its part of each row, four positions at a time, were faster with the keys in the cache
// but slower from memory, where the hardware's prefetchers follow whole rows read in order.)
template <class T>
WARMPOOL_AVX512_TARGET void Scores(const AttentionShape& s, const float* q, std::span<const KvRun<T>> runs,
                                   uint64_t stride, uint32_t kv_first, uint32_t kv_count, float* scores,
                                   uint64_t width) {
  const uint32_t group = s.heads / s.kv_heads;
  const uint32_t vectors = s.head_dim / kLanes;
  uint64_t position = 0;
  for (const KvRun<T>& run : runs) {
    for (uint32_t i = 0; i < run.count; ++i, ++position) {
      const T* key = run.key + i * stride;
      for (uint32_t g = kv_first; g < kv_first + kv_count; ++g) {
        const T* head_key = key + uint64_t{g} * s.head_dim;
        for (uint32_t h0 = 0; h0 < group; h0 += kQuad) {
          const uint32_t quad = std::min(kQuad, group - h0);
          const float* queries = q + (uint64_t{g} * group + h0) * s.head_dim;
          __m512 acc[kQuad] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
          for (uint32_t v = 0; v < vectors; ++v) {
            const __m512 k = Load16(head_key + v * kLanes);
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

// out[g * group + h] = Σ_p weights[(g - kv_first) * group + h][p] · value_p[g], a run (a block of
// the cache) at a time, a tile at a time over it. It added into `out` in memory position by
// position before: a load and a store with each multiply-add.
template <class T>
void Weigh(const AttentionShape& s, const float* weights, std::span<const KvRun<T>> runs, uint64_t stride,
           uint32_t kv_first, uint32_t kv_count, uint64_t width, float* out) {
  const uint32_t group = s.heads / s.kv_heads;
  const uint32_t vectors = s.head_dim / kLanes;
  uint64_t position = 0;
  for (size_t r = 0; r < runs.size(); position += runs[r].count, ++r) {
    for (uint32_t g = kv_first; g < kv_first + kv_count; ++g) {
      for (uint32_t h0 = 0; h0 < group; h0 += kTile) {
        for (uint32_t v0 = 0; v0 < vectors; v0 += kTile) {
          kWeighTiles<T>[std::min(kTile, group - h0) - 1][std::min(kTile, vectors - v0) - 1](
              weights + (uint64_t{g - kv_first} * group + h0) * width, width, position,
              runs[r].value + uint64_t{g} * s.head_dim + v0 * kLanes, runs[r].count, stride, s.head_dim, r != 0,
              out + (uint64_t{g} * group + h0) * s.head_dim + v0 * kLanes);
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

bool HaveBF16KvCache(uint32_t head_dim) { return dense::HaveBF16Gemv() && HaveAttendRuns(head_dim); }

KvElement ChooseKvElement(safetensors::DType key_value_weights, uint32_t head_dim, bool on_device) {
  return !on_device && key_value_weights == safetensors::DType::BF16 && HaveBF16KvCache(head_dim) ? KvElement::kBF16
                                                                                                 : KvElement::kF32;
}

template <class T>
void AttendRuns(const AttentionShape& shape, const float* q, std::span<const KvRun<T>> runs, uint64_t stride,
                uint32_t kv_first, uint32_t kv_count, float* scores, float* out) {
  uint64_t width = 0;
  for (const KvRun<T>& run : runs) width += run.count;
  Scores(shape, q, runs, stride, kv_first, kv_count, scores, width);
  const uint32_t rows = kv_count * (shape.heads / shape.kv_heads);
  for (uint32_t r = 0; r < rows; ++r) Softmax(scores + uint64_t{r} * width, static_cast<uint32_t>(width));
  Weigh(shape, scores, runs, stride, kv_first, kv_count, width, out);
}
template void AttendRuns<float>(const AttentionShape&, const float*, std::span<const KvRun<float>>, uint64_t,
                                uint32_t, uint32_t, float*, float*);
template void AttendRuns<uint16_t>(const AttentionShape&, const float*, std::span<const KvRun<uint16_t>>, uint64_t,
                                   uint32_t, uint32_t, float*, float*);

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

namespace {

// A row's keys and values over positions first .. end - 1, a block's run at a time, attended.
template <class T>
void AttendCached(const AttentionShape& shape, const Config& c, KvCache& cache, uint32_t layer, uint32_t first,
                  uint32_t end, const float* q, uint32_t kv_first, uint32_t kv_count, float* scores, float* out) {
  thread_local std::vector<KvRun<T>> kv_runs;
  kv_runs.clear();
  for (uint32_t p = first; p < end;) {
    const uint32_t span = KvCache::Contiguous(p, end);
    if constexpr (std::is_same_v<T, float>) {
      kv_runs.push_back({cache.key(layer, p), cache.value(layer, p), span});
    } else {
      kv_runs.push_back({cache.key_bf16(layer, p), cache.value_bf16(layer, p), span});
    }
    p += span;
  }
  AttendRuns<T>(shape, q, kv_runs, c.kv_size(), kv_first, kv_count, scores, out);
}

}  // namespace

Status DecodeAttention(const Config& c, uint32_t layer, std::span<const DecodeRows> runs, int threads) {
  const uint32_t group = c.num_attention_heads / c.num_key_value_heads;
  const uint32_t d = c.head_dim;
  const bool runs_here = HaveAttendRuns(d);
  for (const DecodeRows& run : runs) {
    // Chosen only where it can be read (ChooseKvElement): a bf16 cache elsewhere is the caller's slip.
    if (run.cache->element() == KvElement::kBF16 && !runs_here) {
      return Error(Code::kFailedPrecondition, "a bf16 KV cache needs AVX-512 and a head size of a multiple of 16");
    }
  }
  // Every run's rows in one parallel loop (a step of several sequences forks once a layer, not once
  // a sequence). A task is a row's KV heads kv_first .. + kv_count: all of them (a row read in
  // order) unless there are more threads than rows to share them; on oneDNN, one KV head each.
  thread_local std::vector<std::pair<const DecodeRows*, uint32_t>> rows;  // a run, a row of it
  rows.clear();
  for (const DecodeRows& run : runs) {
    for (uint32_t r = 0; r < run.rows; ++r) rows.emplace_back(&run, r);
  }
  if (rows.empty()) return OkStatus();
  const auto count = static_cast<uint32_t>(rows.size());
  const uint32_t parts = runs_here ? std::clamp<uint32_t>((threads + count - 1) / count, 1, c.num_key_value_heads)
                                   : c.num_key_value_heads;
  const int64_t tasks = int64_t{count} * parts;
  const AttentionShape shape{c.num_attention_heads, c.num_key_value_heads, d, 1.0f / std::sqrt(static_cast<float>(d))};
  const auto* all_rows = rows.data();  // (thread_local: the team's threads have their own `rows`)
  std::atomic<int> failed{dnnl_success};
  // Dynamic: the rows' sequences may be of any lengths.
#pragma omp parallel for num_threads(threads) schedule(dynamic)
  for (int64_t task = 0; task < tasks; ++task) {
    const auto [run, r] = all_rows[task / parts];
    const auto part = static_cast<uint32_t>(task % parts);
    const uint32_t kv_first = part * c.num_key_value_heads / parts;
    const uint32_t kv_count = (part + 1) * c.num_key_value_heads / parts - kv_first;
    const uint32_t position = run->start + r;
    // Causal, and within the sliding window where the config has one (the window counts the
    // token itself).
    const uint32_t first = c.sliding_window != 0 && position + 1 > c.sliding_window
                               ? static_cast<uint32_t>(position + 1 - c.sliding_window)
                               : 0;
    const uint32_t end = position + 1;
    const float* row_q = run->q + uint64_t{r} * c.q_size();
    float* row_out = run->out + uint64_t{r} * c.q_size();
    KvCache& cache = *run->cache;
    thread_local std::vector<float> scores;
    scores.resize(uint64_t{kv_count} * group * (end - first));
    if (runs_here && cache.element() == KvElement::kBF16) {
      AttendCached<uint16_t>(shape, c, cache, layer, first, end, row_q, kv_first, kv_count, scores.data(), row_out);
      continue;
    }
    if (runs_here) {
      AttendCached<float>(shape, c, cache, layer, first, end, row_q, kv_first, kv_count, scores.data(), row_out);
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

Status DecodeAttention(const Config& c, uint32_t layer, uint32_t rows, uint32_t start, KvCache& cache, const float* q,
                       float* out, int threads) {
  const DecodeRows run{rows, start, &cache, q, out};
  return DecodeAttention(c, layer, std::span<const DecodeRows>(&run, 1), threads);
}

}  // namespace warmpool::transformer
