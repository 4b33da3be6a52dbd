#include "engines/cuda/kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace warmpool::dense::cuda {
namespace {

constexpr unsigned kThreads = 256;

unsigned Blocks(uint64_t count) {
  const uint64_t blocks = (count + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65535 * 32 ? blocks : 65535 * 32);
}

__global__ void NarrowToHalf(const float* x, __half* y, uint64_t count) {
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < count; i += uint64_t{gridDim.x} * blockDim.x) {
    y[i] = __float2half_rn(x[i]);
  }
}

__global__ void NarrowToBf16(const float* x, __nv_bfloat16* y, uint64_t count) {
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < count; i += uint64_t{gridDim.x} * blockDim.x) {
    y[i] = __float2bfloat16_rn(x[i]);
  }
}

__global__ void BiasActivate(float* y, const float* bias, uint32_t rows, uint32_t out, int activation) {
  const uint64_t count = uint64_t{rows} * out;
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < count; i += uint64_t{gridDim.x} * blockDim.x) {
    float v = y[i] + (bias != nullptr ? bias[i % out] : 0.0f);
    switch (activation) {
      // Not fmaxf(v, 0), which returns 0 for NaN: a comparison with NaN is false, so NaN passes.
      case kRelu: v = v < 0.0f ? 0.0f : v; break;
      // x * Phi(x) tends to 0 at -Inf, where 0.5 x (1 + erf(x / sqrt 2)) is -Inf * 0 = NaN.
      case kGelu: v = v == -INFINITY ? 0.0f : 0.5f * v * (1.0f + erff(v * 0.70710678118654752f)); break;
      case kTanh: v = tanhf(v); break;
      default: break;
    }
    y[i] = v;
  }
}

}  // namespace

cudaError_t LaunchNarrow(const float* x, void* y, uint64_t count, bool bf16, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  if (bf16) {
    NarrowToBf16<<<Blocks(count), kThreads, 0, stream>>>(x, static_cast<__nv_bfloat16*>(y), count);
  } else {
    NarrowToHalf<<<Blocks(count), kThreads, 0, stream>>>(x, static_cast<__half*>(y), count);
  }
  return cudaGetLastError();
}

cudaError_t LaunchBiasActivate(float* y, const float* bias, uint32_t rows, uint32_t out, int activation,
                               cudaStream_t stream) {
  const uint64_t count = uint64_t{rows} * out;
  if (count == 0 || (bias == nullptr && activation == kNone)) return cudaSuccess;
  BiasActivate<<<Blocks(count), kThreads, 0, stream>>>(y, bias, rows, out, activation);
  return cudaGetLastError();
}

}  // namespace warmpool::dense::cuda
