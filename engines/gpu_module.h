// Finds and loads a GPU module: a shared object built from engines/cuda with nvcc and cuBLAS that
// a worker opens only when a model's weights are in device memory. warmpool-worker itself never
// links the CUDA runtime or cuBLAS, so the same binaries run where there is no CUDA at all.
//
// A module is looked for beside the running binary (the build tree, the GPU bundle), then where the
// install rules put it (WARMPOOL_GPU_MODULES_FROM_BINDIR, relative to the binary's directory). It is
// never unloaded: the CUDA runtime inside does not support it.
#pragma once

#include <string>

namespace warmpool {

// The engines' GPU code (engines/cuda): the dense engine's layers and the transformer's forward
// pass, in one module so that a worker starts one CUDA runtime.
inline constexpr char kEnginesGpuModule[] = "warmpool-engines-cuda.so";

struct GpuModuleEntry {
  void* entry = nullptr;  // the symbol's address
  std::string why;        // when entry is null: what was tried, or what failed
};

// Loads `file` and looks up `symbol` in it, once per process per pair: later calls return the first
// answer. RTLD_LOCAL: cuBLAS and the CUDA runtime stay out of the worker's global symbols.
const GpuModuleEntry& LoadGpuModule(const std::string& file, const std::string& symbol);

}  // namespace warmpool
