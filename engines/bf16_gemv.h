// A matrix-vector kernel for bf16 weights at small batches, on AVX-512 BF16 (`vdpbf16ps`): the
// weights stay 16-bit, are streamed from memory once for up to 8 rows (more rows: a pass per 8, the
// later ones from the L2 cache), and each instruction takes 32 weight-input pairs, accumulating in
// f32. oneDNN 2.6's bf16 matmul runs a single row at about half the memory bandwidth
// (warmpool-bench --compute), and that is the most common latency-bound call; this kernel serves
// the smallest batches, oneDNN the rest: up to 4 rows in the dense engine (engines/dense_cpu.cc),
// up to 16 in the transformer engine's steps (engines/transformer/cpu_model.cc).
#pragma once

#include <cstdint>

namespace warmpool::dense {

// Whether this CPU (and the OS) runs BF16Gemv: AVX-512F, BW and BF16, checked once at run time.
bool HaveBF16Gemv();

// out[i] = in[i] rounded to bf16 (to nearest, ties to even; a NaN stays a NaN) for i < count, the
// kernel's input from f32 activations, 32 at a time (VCVTNE2PS2BF16). Unlike the scalar
// conversion, a subnormal float becomes zero, as the kernel takes it anyway. HaveBF16Gemv must be
// true.
void NarrowToBF16(const float* in, uint64_t count, uint16_t* out);

// output[r * out + n] = sum_k W[n][k] * input[r * in + k] (+ bias[n]) for every row r < rows and
// output n < out. W is [out, in] bf16, little-endian, at any byte alignment; the input is bf16
// too (activations narrowed, as oneDNN's bf16 matmul takes them); bias may be null. Products are
// summed in f32. The outputs are split over `threads` OpenMP threads. HaveBF16Gemv must be true.
void BF16Gemv(const uint8_t* weight, uint32_t in, uint32_t out, const uint16_t* input, uint32_t rows,
              const float* bias, float* output, int threads);

}  // namespace warmpool::dense
