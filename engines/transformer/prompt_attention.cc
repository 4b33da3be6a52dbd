#include "engines/transformer/prompt_attention.h"

#include <omp.h>

#include <algorithm>
#include <bit>
#include <atomic>
#include <cmath>
#include <vector>

#include <dnnl.h>

#include "engines/transformer/vector_exp.h"

namespace warmpool::transformer {

namespace {

// Query rows per task: the scores of one tile are tile x positions floats (8 MiB at 32k positions).
constexpr uint32_t kTileRows = 64;

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

void Softmax(float* x, uint32_t n) {
  float max = -INFINITY;
  for (uint32_t j = 0; j < n; ++j) max = std::max(max, x[j]);
  for (uint32_t j = 0; j < n; ++j) x[j] -= max;
  ExpInPlace(x, n);
  float total = 0;
#pragma omp simd reduction(+ : total)
  for (uint32_t j = 0; j < n; ++j) total += x[j];
  for (uint32_t j = 0; j < n; ++j) x[j] /= total;
}

Status PromptAttention(const Config& c, uint32_t layer, uint32_t rows, uint32_t start, KvCache& cache,
                       const float* q, float* out, int threads) {
  const uint32_t group = c.num_attention_heads / c.num_key_value_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  const uint32_t tiles = (rows + kTileRows - 1) / kTileRows;
  const int64_t tasks = int64_t{tiles} * c.num_attention_heads;
  std::atomic<int> failed{dnnl_success};
  // A bf16 cache's rows are widened once for the query heads that share them: a thread keeps what
  // it widened for a tile and KV head of this call (the heads of a group are consecutive tasks).
  // Within a call the positions a tile sees do not change; across calls the same cache and
  // positions may hold others (a later pass, another sequence in the slot), hence the call's number.
  static std::atomic<uint64_t> calls{0};
  const uint64_t call = calls.fetch_add(1, std::memory_order_relaxed) + 1;
  // Later tiles see more keys: dynamic, so that the threads finish together. Inside the parallel
  // loop oneDNN runs each product on the calling thread.
#pragma omp parallel for num_threads(threads) schedule(dynamic)
  for (int64_t task = 0; task < tasks; ++task) {
    const auto h = static_cast<uint32_t>(task % c.num_attention_heads);
    const auto r0 = static_cast<uint32_t>(task / c.num_attention_heads) * kTileRows;
    const uint32_t n = std::min(kTileRows, rows - r0);
    // The keys any row of the tile may see: from the first row's window start to the last row.
    const uint32_t end = start + r0 + n;  // exclusive
    const uint32_t lo = FirstVisible(c, start + r0);
    const uint32_t width = end - lo;
    const uint64_t head = uint64_t{h / group} * c.head_dim;  // the KV head's place in a position's row
    const float* queries = q + uint64_t{r0} * c.q_size() + uint64_t{h} * c.head_dim;
    thread_local std::vector<float> scores;
    scores.resize(uint64_t{n} * width);
    // The keys and values the tile sees, a block's run at a time, kv_size elements apart in the cache;
    // a bf16 cache's widened first, the KV head's alone, into one run of head_dim floats apart
    // (oneDNN's products here take f32).
    const bool widened = cache.element() == KvElement::kBF16;
    thread_local std::vector<float> wide_keys, wide_values;
    thread_local uint64_t widened_call = 0;
    thread_local uint32_t widened_tile = 0, widened_head = 0;
    if (widened && (widened_call != call || widened_tile != r0 || widened_head != h / group)) {
      widened_call = call;
      widened_tile = r0;
      widened_head = h / group;
      wide_keys.resize(uint64_t{width} * c.head_dim);
      wide_values.resize(wide_keys.size());
      for (uint32_t p = lo; p < end;) {
        const uint32_t span = KvCache::Contiguous(p, end);
        const uint64_t at = uint64_t{p - lo} * c.head_dim;
        WidenRows(cache.key_bf16(layer, p) + head, span, c.head_dim, c.kv_size(), wide_keys.data() + at);
        WidenRows(cache.value_bf16(layer, p) + head, span, c.head_dim, c.kv_size(), wide_values.data() + at);
        p += span;
      }
    }
    const uint64_t ld = widened ? c.head_dim : c.kv_size();
    auto span_at = [&](uint32_t p) { return widened ? end - p : KvCache::Contiguous(p, end); };
    auto key_at = [&](uint32_t p) -> const float* {
      return widened ? wide_keys.data() + uint64_t{p - lo} * c.head_dim : cache.key(layer, p) + head;
    };
    auto value_at = [&](uint32_t p) -> const float* {
      return widened ? wide_values.data() + uint64_t{p - lo} * c.head_dim : cache.value(layer, p) + head;
    };
    // Q·Kᵀ a run at a time, each run's scores a band of columns.
    dnnl_status_t s = dnnl_success;
    bool finite = true;
    for (uint32_t p = lo; p < end && s == dnnl_success;) {
      const uint32_t span = span_at(p);
      s = dnnl_sgemm('N', 'T', n, span, c.head_dim, scale, queries, c.q_size(), key_at(p), ld, 0.0f,
                     scores.data() + (p - lo), width);
      finite = finite && Finite(value_at(p), span, c.head_dim, ld);
      p += span;
    }
    for (uint32_t i = 0; i < n && s == dnnl_success; ++i) {
      // Row i sees positions first .. position (causal, and within the window, which counts the
      // token itself); the rest of its scores weigh nothing.
      const uint32_t position = start + r0 + i;
      const uint32_t first = FirstVisible(c, position);
      float* row = scores.data() + uint64_t{i} * width;
      const uint32_t a = first - lo, b = position - lo + 1;
      Softmax(row + a, b - a);
      std::fill(row, row + a, 0.0f);
      std::fill(row + b, row + width, 0.0f);
    }
    float* o = out + uint64_t{r0} * c.q_size() + uint64_t{h} * c.head_dim;
    if (s == dnnl_success && finite) {
      // P·V, the blocks' products summed into the output.
      for (uint32_t p = lo; p < end && s == dnnl_success;) {
        const uint32_t span = span_at(p);
        s = dnnl_sgemm('N', 'N', n, c.head_dim, span, 1.0f, scores.data() + (p - lo), width, value_at(p), ld,
                       p == lo ? 0.0f : 1.0f, o, c.q_size());
        p += span;
      }
    } else if (s == dnnl_success) {
      // A value that is not finite must reach only the rows that see it: as a product, the zero
      // weight of a row that does not would make 0 x inf = NaN of it. Row by row, over exactly what
      // each sees, as the decode loop weighs them.
      for (uint32_t i = 0; i < n; ++i) {
        const uint32_t position = start + r0 + i;
        const uint32_t first = FirstVisible(c, position);
        const float* p = scores.data() + uint64_t{i} * width;
        float* row_out = o + uint64_t{i} * c.q_size();
        std::fill(row_out, row_out + c.head_dim, 0.0f);
        for (uint32_t j = first; j <= position; ++j) {
          const float* v = value_at(j);
          for (uint32_t d = 0; d < c.head_dim; ++d) row_out[d] += p[j - lo] * v[d];
        }
      }
    }
    if (s != dnnl_success) failed = s;
  }
  if (failed != dnnl_success) return Error(Code::kInternal, "oneDNN refused an attention product (status {})", failed.load());
  return OkStatus();
}

}  // namespace warmpool::transformer
