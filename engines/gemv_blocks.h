// How the small-batch kernels (gemv.cc, bf16_gemv.cc) walk a layer: its
// outputs in blocks whose weights fit in the L2 cache, each block computed for every group of
// rows before the next, so the block's weights come from memory once and from the cache for the
// other groups. Blocks are split over OpenMP threads.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace warmpool::dense {

inline constexpr size_t kGemvBlockWeightBytes = 256 << 10;

// pass(n_begin, n_end, first_row, row_count) for every block of outputs and group of at most
// `per_pass` rows. Block sizes are multiples of 12 (so that only the last block has outputs that a
// kernel taking four or three at a time must take one by one), at least 12 outputs.
// element_bytes: of one weight.
template <typename Pass>
void ForEachGemvBlock(uint32_t in, uint32_t out, uint32_t rows, uint32_t per_pass, size_t element_bytes, int threads,
                      Pass pass) {
  if (out == 0) return;
  // As many blocks as the budget asks, then sizes evened out among them (rounded up to 12): the
  // threads split the blocks statically, and blocks rounded down would leave a small last one (at
  // 256 outputs, 120 + 120 + 16: one thread of two doing 240).
  const size_t most = std::max<size_t>(12, kGemvBlockWeightBytes / (size_t{in} * element_bytes));
  const size_t wanted = (out + most - 1) / most;
  const auto block = static_cast<uint32_t>(((out + wanted - 1) / wanted + 11) / 12 * 12);
  const auto blocks = static_cast<int64_t>((out + block - 1) / block);
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && blocks > 1)
  for (int64_t b = 0; b < blocks; ++b) {
    const uint32_t n_begin = static_cast<uint32_t>(b) * block;
    const uint32_t n_end = std::min(out, n_begin + block);
    for (uint32_t first = 0; first < rows; first += per_pass) pass(n_begin, n_end, first, std::min(per_pass, rows - first));
  }
}

}  // namespace warmpool::dense
