#include "engines/transformer/gpu_sequence.h"

#include "engines/gpu_module.h"

namespace warmpool::transformer {

std::unique_ptr<GpuModel> StartGpuModel(const Config& config, const ModelWeights& weights,
                                        const wp_device_memory* memory, uint32_t context, uint32_t sequences,
                                        uint32_t pool_blocks, std::string* why) {
  // The GPU's kernels and its pool's layout (PlanGpu) are f32's: a config that says otherwise was
  // meant for the CPU (ChooseKvElement chooses f32 on a device).
  if (config.kv_element != KvElement::kF32) {
    *why = "the GPU keeps its KV cache in f32, and this model's config asks for another element";
    return nullptr;
  }
  const GpuModuleEntry& module = LoadGpuModule(kEnginesGpuModule, kGpuModelStartSymbol);
  if (module.entry == nullptr) {
    *why = module.why;
    return nullptr;
  }
  auto start = reinterpret_cast<GpuModelStart>(module.entry);
  return std::unique_ptr<GpuModel>(start(&config, &weights, memory, context, sequences, pool_blocks, why));
}

}  // namespace warmpool::transformer
