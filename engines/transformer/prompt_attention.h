// Causal attention of a prompt's rows (a prefill piece) over the KV cache, as matrix products:
// per KV head, the scores Q·Kᵀ and then P·V in oneDNN's sgemm for the rows' query heads that
// share it (a product's rows are a chunk of rows times those heads), with the mask and the softmax
// between them. A decode step (one row) reads each key once whatever the loop, but a prompt's rows
// all read the same keys: as products they are read once per tile of rows, at the arithmetic's
// pace, instead of once per row and head in dot products of head_dim floats. With the heads that
// share a KV head in one product and the softmax in AVX-512, a 16-token piece's step beside a
// decode row at position 2000 of a 256 MiB model ran 1.3 to 1.4 times faster than with a product
// per head (docs/benchmarks.md, "A prompt's pieces at long positions").
#pragma once

#include <cstdint>

#include "common/status.h"
#include "engines/transformer/config.h"
#include "engines/transformer/kv_cache.h"

namespace warmpool::transformer {

// Rows of the prompt (positions start .. start + rows - 1) whose queries are in q (rows x q_size)
// attend to positions 0 .. start + rows - 1 of the cache's `layer` (the rows' own keys and values
// already written), each within the config's sliding window; out receives rows x q_size. The
// products run a block of the cache at a time. Work is split over the heads and tiles of rows on
// `threads`. INTERNAL when oneDNN refuses a product (nothing else is expected to fail).
Status PromptAttention(const Config& config, uint32_t layer, uint32_t rows, uint32_t start, KvCache& cache,
                       const float* q, float* out, int threads);

// x[0 .. n - 1] replaced by its softmax (n >= 1): in AVX-512 where the CPU has it, else in
// SoftmaxLoops.
void Softmax(float* x, uint32_t n);
// The same in plain loops (what Softmax runs without AVX-512; its tests run both).
void SoftmaxLoops(float* x, uint32_t n);

}  // namespace warmpool::transformer
