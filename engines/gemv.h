// Matrix-vector kernels for the small batches that are bound by memory bandwidth, with the weights
// streamed from memory once for all rows. f16: the 16-bit weights are converted to f32 in
// registers (F16C), so an f16 layer reads half the bytes of an f32 one; oneDNN 2.x has no f16
// matmul on CPUs, which is why this one exists; bigger batches are compute-bound and go to
// oneDNN's f32 matmul on a widened copy (engines/dense_cpu.cc). f32 (AVX-512): for a single row,
// which oneDNN 2.6's matmul runs well below the bandwidth (warmpool-bench --compute).
#pragma once

#include <cstdint>

namespace warmpool::dense {

// Whether this CPU runs F16Gemv (AVX2 or AVX-512F, with FMA and F16C), checked once at run time.
bool HaveF16Gemv();

// IEEE halves (any byte alignment) to f32 with F16C, split over `threads` threads; HaveF16Gemv
// must be true. What a batch too big for the kernel runs on.
void WidenHalves(const uint8_t* halves, uint64_t count, float* out, int threads);

// The instruction sets the kernel is written for; F16Gemv uses the widest this CPU has.
enum class F16Isa { kAvx2, kAvx512 };
bool HaveF16Isa(F16Isa isa);
F16Isa BestF16Isa();

// output[r * out + n] = sum_k W[n][k] * input[r * in + k] (+ bias[n]) for every row r < rows and
// output n < out. W is [out, in] IEEE half, little-endian, at any byte alignment; bias may be null.
// Accumulates in f32. The outputs are split over `threads` OpenMP threads.
void F16Gemv(const uint8_t* weight, uint32_t in, uint32_t out, const float* input, uint32_t rows,
             const float* bias, float* output, int threads);
// The same with the given instruction set (which the CPU must have: HaveF16Isa), for tests.
void F16GemvOn(F16Isa isa, const uint8_t* weight, uint32_t in, uint32_t out, const float* input, uint32_t rows,
               const float* bias, float* output, int threads);

// The same for f32 weights ([out, in], any byte alignment), on AVX-512F with FMA: HaveF32Gemv.
bool HaveF32Gemv();
void F32Gemv(const uint8_t* weight, uint32_t in, uint32_t out, const float* input, uint32_t rows,
             const float* bias, float* output, int threads);

}  // namespace warmpool::dense
