#include "engines/transformer/gpu_sequence.h"

#include "engines/gpu_module.h"

namespace warmpool::transformer {

std::unique_ptr<Sequence> StartGpuSequence(const Config& config, const ModelWeights& weights,
                                           const wp_device_memory* memory, uint32_t context, std::string* why) {
  const GpuModuleEntry& module = LoadGpuModule(kEnginesGpuModule, kGpuSequenceStartSymbol);
  if (module.entry == nullptr) {
    *why = module.why;
    return nullptr;
  }
  auto start = reinterpret_cast<GpuSequenceStart>(module.entry);
  return std::unique_ptr<Sequence>(start(&config, &weights, memory, context, why));
}

}  // namespace warmpool::transformer
