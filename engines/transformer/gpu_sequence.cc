#include "engines/transformer/gpu_sequence.h"

#include "engines/gpu_module.h"

namespace warmpool::transformer {

std::unique_ptr<GpuModel> StartGpuModel(const Config& config, const ModelWeights& weights,
                                        const wp_device_memory* memory, uint32_t context, uint32_t sequences,
                                        uint32_t pool_blocks, std::string* why) {
  const GpuModuleEntry& module = LoadGpuModule(kEnginesGpuModule, kGpuModelStartSymbol);
  if (module.entry == nullptr) {
    *why = module.why;
    return nullptr;
  }
  auto start = reinterpret_cast<GpuModelStart>(module.entry);
  return std::unique_ptr<GpuModel>(start(&config, &weights, memory, context, sequences, pool_blocks, why));
}

}  // namespace warmpool::transformer
