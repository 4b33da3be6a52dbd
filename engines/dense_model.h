// The structure of a dense (MLP) model, read from a safetensors header alone: which tensors form
// which linear layer, how they chain, and how much memory inference needs. No weights are read here.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "engines/safetensors.h"

namespace warmpool::dense {

enum class Activation { kRelu, kGelu, kTanh, kNone };

std::string_view ActivationName(Activation activation);

// One nn.Linear: y = x * W^T + b with W stored [out, in] as PyTorch does.
struct LinearLayer {
  uint64_t index = 0;  // the nn.Sequential position ("2" in "2.weight")
  safetensors::TensorInfo weight;
  std::optional<safetensors::TensorInfo> bias;
  uint32_t in_features = 0;
  uint32_t out_features = 0;
};

struct DenseModel {
  std::vector<LinearLayer> layers;  // in execution order
  Activation activation = Activation::kRelu;
  uint32_t in_features = 0;
  uint32_t out_features = 0;
};

// Rows per inference step; infer calls with more rows are processed in steps of this many.
inline constexpr uint32_t kMaxBatch = 256;

// True when a weight cannot be used in place at every batch size (a 16-bit dtype, or f32 that is
// not 4-byte aligned in the data area): it may be widened or copied into an f32 scratch buffer.
bool NeedsConversion(const safetensors::TensorInfo& tensor);

// Validates that the header describes an MLP this engine can run; source names the file.
Result<DenseModel> DescribeModel(const safetensors::Header& header, std::string_view source);

// The scratch of the layers on the CPU (engines/dense_cpu.h): two activation buffers of kMaxBatch
// rows of the widest hidden layer, a conversion buffer for the largest weight that may need one,
// the activations narrowed to bf16 for bf16 layers, and every bias widened to f32.
struct ScratchSizes {
  uint64_t activation_floats = 0;  // per buffer; there are two
  uint64_t conversion_floats = 0;  // the largest weight that may be widened or copied
  uint64_t narrow_halves = 0;      // kMaxBatch rows of the widest input of a bf16 layer
  uint64_t bias_floats = 0;        // every layer's bias
};
ScratchSizes ScratchFor(const DenseModel& model);
// The workspace an engine reports for preflight.
inline uint64_t WorkspaceBytes(const ScratchSizes& s) {
  return (2 * s.activation_floats + s.conversion_floats + s.bias_floats) * sizeof(float) + s.narrow_halves * 2;
}

// The workspace of the model's layers on a GPU (engines/dense_gpu.h), carved from one region:
// two f32 activation buffers of kMaxBatch rows of the widest layer (input and output included),
// a 16-bit copy of the activations for f16/bf16 layers, every bias widened to f32 (cuBLAS adds
// them in its epilogue), and cuBLASLt's own workspace. Each part starts 256-byte aligned.
struct GpuWorkspace {
  uint64_t activations[2] = {0, 0};  // offsets
  uint64_t half = 0;
  std::vector<uint64_t> biases;      // per layer; kNoBias for a layer without one
  uint64_t blas = 0;
  uint64_t blas_bytes = 0;
  uint64_t total = 0;
};
inline constexpr uint64_t kNoBias = ~0ull;
inline constexpr uint64_t kGpuBlasWorkspaceBytes = 1ull << 20;
GpuWorkspace PlanGpuWorkspace(const DenseModel& model);

// A tensor's stored bytes (f32, f16 or bf16, any alignment) as f32.
void WidenToFloat(const uint8_t* source, safetensors::DType dtype, uint64_t count, float* destination);

}  // namespace warmpool::dense
