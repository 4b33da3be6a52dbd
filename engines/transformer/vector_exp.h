// exp over arrays of floats, vectorised: the softmax of attention (a score per key, every layer
// and head) and SwiGLU's sigmoid (every MLP activation) call it millions of times a prompt piece,
// where std::exp is a scalar call of a few nanoseconds each.
#pragma once

#include <cstdint>

namespace warmpool::transformer {

// x[i] = exp(x[i]) for i < n: within 1e-7 relative of the exact value wherever the result is a
// normal float; denormal results as exact as the format allows, 0 below them, +inf above FLT_MAX's
// logarithm, NaN for NaN. Runs in the widest vectors the CPU has (AVX-512, AVX2, else SSE2). A
// value's result is the same bits at any index of any n.
void ExpInPlace(float* x, uint64_t n);

}  // namespace warmpool::transformer
