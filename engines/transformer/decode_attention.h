// Attention of a few rows of a sequence (decode steps: fewer than kPromptAttentionRows) over its
// KV cache, of one sequence or of a step's several in one call. On AVX-512F (AttendRuns) the scores go position by position, each row of keys read once
// for all its heads; the weighted sum of the values goes in tiles of up to four heads by four
// vectors whose sums stay in registers over a block of positions. Elsewhere, and for head sizes
// that are not a multiple of 16, the query heads sharing a KV head are one oneDNN product's rows
// per block: a call per KV head and block cost more than its 16K multiply-adds.
//
// `warmpool-bench --generate --attention` times it alone for 8 sequences over the 11 layers of the
// streams bench's model (docs/benchmarks.md): with the tiles and the file at -O3, 5.3 ms instead
// of 5.5 to 6.2 from memory and 2.4 instead of 3.8 to 4.6 from the cache at 256 positions; 25
// instead of 29 to 36 and 11 instead of 17 to 27 at 1024 (a 2-core EPYC VM, 2026-12-07). A bf16
// cache (ChooseKvElement) is widened as it is read: 0.66x the f32 time from memory at 256
// positions, 0.68x at 1024, 0.9x in the cache.
#pragma once

#include <cstdint>
#include <span>

#include "common/status.h"
#include "engines/transformer/config.h"
#include "engines/safetensors.h"
#include "engines/transformer/kv_cache.h"

namespace warmpool::transformer {

// Rows at positions start .. start + rows - 1, their queries in q (rows x q_size), each attending
// to the cache's positions up to its own (within the config's sliding window), their keys and
// values already written; out receives rows x q_size. Work is split over rows, and over KV heads
// where there are more threads than rows. INTERNAL when oneDNN refuses a product.
Status DecodeAttention(const Config& config, uint32_t layer, uint32_t rows, uint32_t start, KvCache& cache,
                       const float* q, float* out, int threads);

// Rows of one sequence for the call below: `rows` rows at positions start .. start + rows - 1,
// their queries in q and their outputs in out (rows x q_size each), over `cache`.
struct DecodeRows {
  uint32_t rows = 0;
  uint32_t start = 0;
  KvCache* cache = nullptr;
  const float* q = nullptr;
  float* out = nullptr;
};

// The same for the rows of several sequences (a continuous-batching step's), in one parallel loop.
Status DecodeAttention(const Config& config, uint32_t layer, std::span<const DecodeRows> runs, int threads);

// A run of positions whose keys and values lie at a fixed stride: position i of the run at
// key + i * stride and value + i * stride, each kv_heads x head_dim elements (T: float, or
// uint16_t for bf16).
template <class T>
struct KvRun {
  const T* key = nullptr;
  const T* value = nullptr;
  uint32_t count = 0;
};

struct AttentionShape {
  uint32_t heads = 0;     // query heads
  uint32_t kv_heads = 0;  // heads / kv_heads query heads share each (grouped-query attention)
  uint32_t head_dim = 0;
  float scale = 0;        // the scores' factor, 1 / sqrt(head_dim)
};

// Whether AttendRuns runs here: AVX-512F, and a head size of a multiple of 16 floats.
bool HaveAttendRuns(uint32_t head_dim);

// For the query heads of KV heads kv_first .. kv_first + kv_count - 1 (the heads of KV head g are
// g * group .. (g + 1) * group - 1): out[h] = Σ_p softmax_p(scale · q[h] · key_p[g]) · value_p[g]
// over every position of `runs`, in order. q and out: heads x head_dim, the row's. scores: scratch
// of kv_count x group x (positions in all runs) floats. HaveAttendRuns must be true, and the
// runs hold at least one position. A NaN or an infinity in a query, key or value comes out as the
// definition's arithmetic makes it.
// bf16 keys and values are widened to f32 as they are read (exactly); the arithmetic is f32's.
template <class T>
void AttendRuns(const AttentionShape& shape, const float* q, std::span<const KvRun<T>> runs, uint64_t stride,
                uint32_t kv_first, uint32_t kv_count, float* scores, float* out);

// Whether a KV cache of bf16 elements can be kept and read here: the bf16 narrowing of the keys and
// values written (AVX-512 BF16) and AttendRuns for this head size.
bool HaveBF16KvCache(uint32_t head_dim);

// The KV cache's element for a model whose key and value projections are stored as
// `key_value_weights`: bf16 for bf16 ones (PyTorch keeps such a model's cache in bf16 too) where this
// CPU can keep one, which halves the bytes a position takes and what a decode step's attention
// reads; f32 otherwise, and on a GPU (whose kernels read f32), its CPU fallback included. The engine
// and any in-process path that is to compute what it does choose by this.
KvElement ChooseKvElement(safetensors::DType key_value_weights, uint32_t head_dim, bool on_device);

}  // namespace warmpool::transformer
