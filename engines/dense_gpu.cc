// The dense engine's GPU module (engines/cuda), loaded the first time a worker with weights in
// device memory asks for it (engines/gpu_module.h).
#include "engines/dense_gpu.h"

#include <atomic>

#include "engines/gpu_module.h"

namespace warmpool::dense {
namespace {

std::atomic<bool> tf32_option{false};

const GpuModuleEntry& TheModule() { return LoadGpuModule(kEnginesGpuModule, kGpuRunnerStartSymbol); }

}  // namespace

void SetGpuOptions(GpuOptions options) { tf32_option = options.tf32; }

void PreloadGpuModule() { (void)TheModule(); }

std::unique_ptr<GpuRunner> StartGpuRunner(const DenseModel& model, const wp_device_memory* memory,
                                          const wp_region& weights, std::string* why) {
  const GpuModuleEntry& module = TheModule();
  if (module.entry == nullptr) {
    *why = module.why;
    return nullptr;
  }
  const GpuOptions options{tf32_option.load()};
  auto start = reinterpret_cast<GpuRunnerStart>(module.entry);
  return std::unique_ptr<GpuRunner>(start(&model, memory, &weights, &options, why));
}

}  // namespace warmpool::dense
