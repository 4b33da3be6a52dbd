// The dense model the recovery benchmark loads: an MLP in_features -> hidden -> out_features of f32
// weights with random values, written as safetensors the way warmpool-mkmodel writes one
// (nn.Sequential names: 0.weight [hidden, in], 0.bias, 2.weight [out, hidden], 2.bias), with the
// hidden width chosen so that the file holds about the requested number of MiB of weights.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace warmpool::bench {

struct DenseModelFile {
  std::string path;
  uint32_t in_features = 0;
  uint32_t hidden = 0;
  uint32_t out_features = 0;
  uint64_t weight_bytes = 0;  // all f32 tensors, biases included
};

// The hidden width that makes in -> hidden -> out hold about target_bytes of f32 weights (>= 1).
uint32_t HiddenWidthFor(uint64_t target_bytes, uint32_t in_features, uint32_t out_features);

// Writes the model to path (in place: the caller owns a private directory). Weights are uniform in
// +-1/sqrt(fan_in), from a fixed seed; activation relu.
Result<DenseModelFile> WriteDenseModel(const std::string& path, uint64_t target_bytes,
                                       uint32_t in_features = 1024, uint32_t out_features = 1024,
                                       uint64_t seed = 1);

}  // namespace warmpool::bench
