// Finds and loads the dense engine's GPU module (engines/cuda) the first time a worker with weights
// in device memory asks for it. Looked for beside the running binary (the build tree, the GPU
// bundle), then where the install rules put it (WARMPOOL_DENSE_CUDA_FROM_BINDIR, relative to the
// binary's directory).
#include "engines/dense_gpu.h"

#include <dlfcn.h>

#include <atomic>
#include <filesystem>
#include <vector>

#include <fmt/format.h>

namespace warmpool::dense {
namespace {

std::atomic<bool> tf32_option{false};

struct Module {
  GpuRunnerStart start = nullptr;
  std::string why;  // when start is null
};

std::string ExecutableDir() {
  std::error_code error;
  std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", error);
  return error ? std::string() : exe.parent_path().string();
}

Module LoadModule() {
  Module module;
  const std::string dir = ExecutableDir();
  std::vector<std::string> candidates = {dir + "/" + kGpuModuleName};
#ifdef WARMPOOL_DENSE_CUDA_FROM_BINDIR
  candidates.push_back(dir + "/" WARMPOOL_DENSE_CUDA_FROM_BINDIR "/" + kGpuModuleName);
#endif
  std::string tried;
  for (const std::string& path : candidates) {
    std::error_code error;
    if (!std::filesystem::exists(path, error)) {
      tried += (tried.empty() ? "" : ", ") + path;
      continue;
    }
    // RTLD_LOCAL: cuBLAS and the CUDA runtime stay out of the worker's global symbols.
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      module.why = fmt::format("cannot load {}: {}", path, dlerror());
      return module;
    }
    module.start = reinterpret_cast<GpuRunnerStart>(dlsym(handle, kGpuRunnerStartSymbol));
    if (module.start == nullptr) module.why = fmt::format("{} has no {}", path, kGpuRunnerStartSymbol);
    return module;  // never unloaded: the CUDA runtime inside does not support it
  }
  module.why = fmt::format("no GPU kernels in this build ({} not found: {})", kGpuModuleName, tried);
  return module;
}

const Module& TheModule() {
  static const Module module = LoadModule();
  return module;
}

}  // namespace

void SetGpuOptions(GpuOptions options) { tf32_option = options.tf32; }

void PreloadGpuModule() { (void)TheModule(); }

std::unique_ptr<GpuRunner> StartGpuRunner(const DenseModel& model, const wp_device_memory* memory,
                                          const wp_region& weights, std::string* why) {
  const Module& module = TheModule();
  if (module.start == nullptr) {
    *why = module.why;
    return nullptr;
  }
  const GpuOptions options{tf32_option.load()};
  return std::unique_ptr<GpuRunner>(module.start(&model, memory, &weights, &options, why));
}

}  // namespace warmpool::dense
