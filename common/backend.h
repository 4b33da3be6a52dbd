// Which device memory serves: the configuration asks (auto, host, cuda), the daemon resolves auto
// at start (supervisor/device_backend.h), and every decision after that reads the resolved value.
// One type for all of them, so that no layer compares spellings; the names are the configuration's
// and the command lines' (warmpoold --backend, the worker's --backend).
#pragma once

#include <optional>
#include <string_view>

namespace warmpool {

enum class Backend {
  kAuto,  // asked for only: cuda when a usable GPU is found, host otherwise
  kHost,  // host memory (memfd regions)
  kCuda,  // CUDA device memory through one owner process per device
};

constexpr std::string_view BackendName(Backend backend) {
  switch (backend) {
    case Backend::kAuto: return "auto";
    case Backend::kHost: return "host";
    case Backend::kCuda: return "cuda";
  }
  return "?";
}

constexpr std::optional<Backend> ParseBackend(std::string_view name) {
  for (Backend b : {Backend::kAuto, Backend::kHost, Backend::kCuda}) {
    if (BackendName(b) == name) return b;
  }
  return std::nullopt;
}

}  // namespace warmpool
