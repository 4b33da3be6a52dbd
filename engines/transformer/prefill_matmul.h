// The products of a prompt's many rows with a weight matrix, on oneDNN's f32 matmul (the library
// PyTorch uses on CPUs): a prefill is bound by arithmetic, not by reading the weights, so loops of
// dot products leave most of the CPU unused. Weights stored as f16 or bf16 (or f32 at an address
// oneDNN cannot take) are widened into f32 scratch once per call; f32 weights are used in place.
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
  std::map<std::tuple<uint32_t, uint32_t, uint32_t, bool>, std::unique_ptr<Primitive>> primitives_;
  std::vector<float> widened_;  // the weights in f32, where they are not used in place
  std::vector<float> bias_;
};

}  // namespace warmpool::transformer
