// A row-major f32 matrix, and its wire form (v1::Tensor).
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "ipc/warmpool.pb.h"

namespace warmpool::client {

struct Matrix {
  uint32_t rows = 0;
  uint32_t cols = 0;
  std::vector<float> data;
};

v1::Tensor ToTensor(const Matrix& m);
// INTERNAL when the tensor's bytes are not rows x cols floats.
Result<Matrix> FromTensor(const v1::Tensor& t);

}  // namespace warmpool::client
