#include "supervisor/device_backend.h"

#include <spdlog/spdlog.h>

#include "supervisor/cuda_devices.h"
#include "supervisor/device_probe.h"
#include "supervisor/host_memory.h"

namespace warmpool::supervisor {

Result<std::unique_ptr<DeviceBackend>> OpenDeviceBackend(Config& config, uv_loop_t* loop, const std::string& owner_path,
                                                         std::function<void(Event)> dispatch) {
  Result<BackendChoice> choice = ChooseBackend(config.backend, owner_path);
  if (!choice.ok()) return choice.status();
  if (choice->cuda) {
    auto cuda = std::make_unique<CudaDevices>(loop, owner_path, std::move(dispatch));
    if (Status s = cuda->Configure(*choice, config); !s.ok()) return s;
    return std::unique_ptr<DeviceBackend>(std::move(cuda));
  }
  config.backend = Backend::kHost;
  config.devices = {DeviceConfig{"", 0, config.budget_bytes}};
  spdlog::info("backend host ({})", choice->why);
  return std::unique_ptr<DeviceBackend>(std::make_unique<HostMemory>());
}

}  // namespace warmpool::supervisor
