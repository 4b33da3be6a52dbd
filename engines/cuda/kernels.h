// The few element-wise kernels the dense engine needs around cuBLAS (kernels.cu, built with nvcc).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace warmpool::dense::cuda {

// Activation codes, as dense::Activation numbers them.
enum ActivationCode : int { kRelu = 0, kGelu = 1, kTanh = 2, kNone = 3 };

// Each returns the launch's error (cudaSuccess when it was queued).
// y[i] = x[i] narrowed to IEEE half (bf16 false) or bfloat16 (bf16 true), round to nearest even.
cudaError_t LaunchNarrow(const float* x, void* y, uint64_t count, bool bf16, cudaStream_t stream);
// y (rows x out, row-major) = act(y + bias), bias (out) may be null. gelu is the exact erf form.
// NaN stays NaN (ReLU included); +-Inf give the activation's limits.
cudaError_t LaunchBiasActivate(float* y, const float* bias, uint32_t rows, uint32_t out, int activation,
                               cudaStream_t stream);

}  // namespace warmpool::dense::cuda
