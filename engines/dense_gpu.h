// The dense engine on a GPU: its layers run with cuBLAS on the device that holds the weights. The
// kernels live in a module of their own (engines/cuda, warmpool-engines-cuda.so beside the worker)
// that only a worker whose weights are in device memory loads: warmpool-worker itself never links
// cuBLAS or the CUDA runtime, so the same binaries run where there is no CUDA at all, and the
// engine computes on the CPU (through the memory service) where the module cannot start.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"
#include "engines/dense_model.h"
#include "warmpool/engine.h"

namespace warmpool::dense {

struct GpuOptions {
  bool tf32 = false;  // f32 layers on TF32 tensor cores (about 10 mantissa bits): only when asked
};
// Process-wide, set by the worker from its flags before any engine opens.
void SetGpuOptions(GpuOptions options);
// Loads the GPU kernels' module (and with it the CUDA runtime and cuBLAS) now rather than at the
// first load of a model on device memory: a worker on a GPU calls it before it says it is ready,
// so that the one-time cost (a second or more: the libraries, the runtime's start) is not taken
// for a load that makes no progress. Whether it can run is still told at the first load.
void PreloadGpuModule();

class GpuRunner {
 public:
  virtual ~GpuRunner() = default;
  // input: rows x in_features (host, f32); output: rows x out_features (host, f32). rows is at most
  // kMaxBatch. The copies in and out run on the runner's own stream; complete when it returns.
  virtual Status Run(const float* input, uint32_t rows, float* output) = 0;
  // What it runs on, for the log ("cuBLAS on CUDA device 0 (NVIDIA H200), f16 layers ...").
  virtual std::string Describe() const = 0;
};

// Starts the model's layers on the device that holds `weights` (a region of `memory`, which must
// not be host-addressable), with its workspace allocated from `memory` (within the budget, as
// GpuWorkspaceBytes counts it). Null, with the reason in `why`, when it cannot: the module is not
// there (a build without the CUDA kernels), the CUDA runtime or cuBLAS does not start, a tensor is
// not aligned for cuBLAS, or the workspace does not fit.
std::unique_ptr<GpuRunner> StartGpuRunner(const DenseModel& model, const wp_device_memory* memory,
                                          const wp_region& weights, std::string* why);

// The module's entry point (extern "C", looked up by name): the same as StartGpuRunner, once the
// module is loaded. Both sides are built together from these headers.
using GpuRunnerStart = GpuRunner* (*)(const DenseModel* model, const wp_device_memory* memory,
                                      const wp_region* weights, const GpuOptions* options,
                                      std::string* why);
inline constexpr char kGpuRunnerStartSymbol[] = "warmpool_dense_cuda_start";

}  // namespace warmpool::dense
