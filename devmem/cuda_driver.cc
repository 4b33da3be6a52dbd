#include "devmem/cuda_driver.h"

#include <dlfcn.h>

#include <memory>

#include <fmt/format.h>

namespace warmpool {

namespace {

// The symbol cuda.h names for a call: WARMPOOL_CUDA_SYMBOL(cuMemGetInfo) is "cuMemGetInfo_v2".
#define WARMPOOL_CUDA_SYMBOL(name) WARMPOOL_CUDA_STRINGIZE(name)
#define WARMPOOL_CUDA_STRINGIZE(name) #name

Code CodeFor(CUresult result) {
  switch (result) {
    case CUDA_SUCCESS: return Code::kOk;
    case CUDA_ERROR_OUT_OF_MEMORY: return Code::kResourceExhausted;
    case CUDA_ERROR_INVALID_VALUE:
    case CUDA_ERROR_INVALID_HANDLE: return Code::kInvalidArgument;
    case CUDA_ERROR_NO_DEVICE:
    case CUDA_ERROR_INVALID_DEVICE:
    case CUDA_ERROR_NOT_INITIALIZED:
    case CUDA_ERROR_DEINITIALIZED:
    case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
    case CUDA_ERROR_DEVICE_UNAVAILABLE:
    case CUDA_ERROR_DEVICE_NOT_LICENSED: return Code::kUnavailable;
    case CUDA_ERROR_NOT_SUPPORTED:
    case CUDA_ERROR_NOT_PERMITTED: return Code::kFailedPrecondition;
    default: return Code::kInternal;
  }
}

}  // namespace

Result<const CudaDriver*> CudaDriver::Get() {
  // Loaded once: dlopen and cuInit are not undone, and every thread sees the same answer.
  static const Result<const CudaDriver*> driver = Load();
  return driver;
}

Result<const CudaDriver*> CudaDriver::Load() {
  // RTLD_LOCAL: the driver's symbols stay out of the global namespace (a plugin linking cudart
  // finds its own way to the driver). The handle is never closed.
  void* library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    return Error(Code::kUnavailable,
                 "cannot load the NVIDIA driver library libcuda.so.1 ({}): install the NVIDIA "
                 "driver, or use the host backend (--backend host)",
                 dlerror());
  }
  // Lives as long as the process once loaded, like the library.
  std::unique_ptr<CudaDriver> driver(new CudaDriver());
#define WARMPOOL_CUDA_RESOLVE(name)                                                         \
  driver->name = reinterpret_cast<decltype(driver->name)>(dlsym(library, WARMPOOL_CUDA_SYMBOL(name))); \
  if (driver->name == nullptr) {                                                            \
    return Error(Code::kUnavailable,                                                        \
                 "the NVIDIA driver lacks {} (warmpool needs a driver for CUDA {}.{} or newer): " \
                 "update the driver, or use the host backend (--backend host)",             \
                 WARMPOOL_CUDA_SYMBOL(name), CUDA_VERSION / 1000, CUDA_VERSION % 1000 / 10); \
  }
  WARMPOOL_CUDA_DRIVER_CALLS(WARMPOOL_CUDA_RESOLVE)
#undef WARMPOOL_CUDA_RESOLVE
  if (CUresult r = driver->cuInit(0); r != CUDA_SUCCESS) {
    Status status = driver->Check(r, "cuInit");
    return Error(Code::kUnavailable, "{}: no usable NVIDIA GPU; use the host backend (--backend host)",
                 status.message());
  }
  if (CUresult r = driver->cuDriverGetVersion(&driver->version_); r != CUDA_SUCCESS) {
    return driver->Check(r, "cuDriverGetVersion");
  }
  return static_cast<const CudaDriver*>(driver.release());
}

std::string CudaDriver::Describe(CUresult result) const {
  const char* name = nullptr;
  const char* text = nullptr;
  if (cuGetErrorName == nullptr || cuGetErrorName(result, &name) != CUDA_SUCCESS) name = nullptr;
  if (cuGetErrorString == nullptr || cuGetErrorString(result, &text) != CUDA_SUCCESS) text = nullptr;
  if (name == nullptr) return fmt::format("CUDA error {}", static_cast<int>(result));
  if (text == nullptr) return name;
  return fmt::format("{} ({})", name, text);
}

Status CudaDriver::Check(CUresult result, std::string_view what) const {
  if (result == CUDA_SUCCESS) return OkStatus();
  return Status(CodeFor(result), fmt::format("{}: {}", what, Describe(result)));
}

}  // namespace warmpool
