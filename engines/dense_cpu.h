// The dense engine's layers on the CPU.
//
// Each layer runs with oneDNN's matmul (the library PyTorch uses on CPUs) on the weights where they
// are stored, never repacked: f32 as f32; bf16 as bf16 with the activations narrowed to bf16 and
// f32 accumulation (AMX or AVX-512 BF16 where the CPU has them, which oneDNN picks at run time);
// the bias (and tanh) fused into the same call, ReLU and GELU in a pass over the output after it
// (oneDNN's fused ReLU turns NaN into 0, its GELU turns -Inf into NaN). Weights are streamed once
// per call, so a small batch runs at the memory bandwidth. oneDNN 2.6 runs one to four rows at
// about half of it, so those go to kernels of ours where the CPU has AVX-512 (engines/gemv.h for
// f32, engines/bf16_gemv.h with AVX-512 BF16 for bf16). oneDNN 2.x has no f16 matmul on CPUs: f16
// layers of up to kGemvRows rows run in a small F16C kernel here (16-bit weights converted in
// registers, streamed once for all rows), and bigger batches widen the layer into f32 scratch and
// run the f32 matmul. Where the CPU lacks what a path needs (AVX2+FMA+F16C, oneDNN's bf16), the
// layer is widened.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/status.h"
#include "engines/dense_model.h"

namespace warmpool::dense {

// Threads the layers of one worker use. Process-wide, set by the worker from its flags before any
// engine opens; 1 until then (workers are processes, and threads beyond the cores they share only
// slow each other down: the supervisor divides the cores among them).
void SetCpuThreads(int threads);
int CpuThreads();

// f16 layers with at most this many rows run in the in-register kernel.
inline constexpr uint32_t kGemvRows = 16;
// f32 layers with at most this many rows run in the AVX-512 kernel where the CPU has it.
inline constexpr uint32_t kF32GemvRows = 4;
// bf16 layers with at most this many rows run in the AVX-512 BF16 kernel where the CPU has it.
inline constexpr uint32_t kBF16GemvRows = 4;

// Whether bf16 layers run on oneDNN's bf16 matmul on this CPU, which takes the activations
// narrowed to bf16; where it has none (an AVX2 CPU) a bf16 layer is widened to f32 and its
// activations stay exact. Both accumulate in f32.
bool HaveBF16Matmul();

// The activation in place, as the layers apply it after the small-batch kernels: NaN stays NaN,
// and +-Inf give the limits (ReLU 0 and +Inf, GELU 0 and +Inf, tanh -1 and 1).
void Activate(Activation activation, float* values, uint64_t count);

// The stored bytes of a tensor (its dtype as in the file): in place for weights in host memory,
// or copied out of device memory. Valid until the next call.
using StoredBytes = std::function<Result<const uint8_t*>(const safetensors::TensorInfo&)>;

class CpuLayers {
 public:
  // Prepares every layer (biases widened to f32 once; primitives made as batch sizes come).
  static Result<std::unique_ptr<CpuLayers>> Start(const DenseModel& model, const StoredBytes& stored);
  virtual ~CpuLayers() = default;
  // input: rows x in_features, output: rows x out_features, rows at most kMaxBatch.
  virtual Status Run(const float* input, uint32_t rows, float* output, const StoredBytes& stored) = 0;
  // How each dtype is computed here, for the log.
  virtual std::string Describe() const = 0;
};

}  // namespace warmpool::dense
