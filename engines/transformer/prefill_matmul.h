// The products of a prompt's many rows with a weight matrix, on oneDNN's matmul (the library
// PyTorch uses on CPUs): a prefill is bound by arithmetic, not by reading the weights, so loops of
// dot products leave most of the CPU unused. bf16 weights are used as stored, the activations
// narrowed to bf16 for the product (accumulating in f32, as PyTorch's bf16 and the GPU path do),
// where oneDNN has a bf16 matmul for this CPU; elsewhere, and for f16 weights (or f32 at an address
// oneDNN cannot take), the weights are widened into f32 scratch once per call; f32 weights are used
// in place.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "common/status.h"
#include "engines/transformer/weights.h"

namespace warmpool::transformer {

class PrefillMatmul {
 public:
  PrefillMatmul();
  ~PrefillMatmul();
  // y[rows x w.rows] = x[rows x w.cols] · wᵀ (+ bias), on `threads` threads.
  Status Run(const float* x, uint32_t rows, const Matrix& w, const Vector& bias, float* y, int threads);

 private:
  struct Primitive;
  // The product for a shape (rows, in, out, bias, bf16), made the first time it runs.
  Primitive* PrimitiveFor(uint32_t rows, uint32_t in, uint32_t out, bool bias, bool bf16);
  std::map<std::tuple<uint32_t, uint32_t, uint32_t, bool, bool>, std::unique_ptr<Primitive>> primitives_;
  std::vector<float> widened_;      // the weights in f32, where they are not used in place
  std::vector<uint16_t> narrowed_;  // the activations in bf16, for bf16 weights
  std::vector<float> bias_;
  bool bf16_products_ = true;       // until oneDNN says it has none for this CPU
};

}  // namespace warmpool::transformer
