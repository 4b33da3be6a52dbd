// The CUDA driver API, loaded at run time with dlopen("libcuda.so.1"). Nothing links libcuda, so
// the same binaries run on a machine without the NVIDIA driver: loading fails with a message that
// says so, and the daemon serves with the host backend.
//
// Only the processes that touch a device load it: workers, device owners and the probe child.
// warmpoold never does: CUDA state does not survive fork, a process that has called cuInit must not
// fork CUDA children, and a driver fault must never reach the process that holds the state.
//
// Types and entry points come from the toolkit's cuda.h, whose macros name each call's current
// version (cuMemGetInfo is cuMemGetInfo_v2): the symbols looked up are exactly those the header
// declares, so a signature mismatch is a compile error, not a crash.
#pragma once

#include <cuda.h>

#include <string>
#include <string_view>

#include "common/status.h"

namespace warmpool {

// Every driver call warmpool makes. The test double (tests/cuda_double) implements the same list.
#define WARMPOOL_CUDA_DRIVER_CALLS(X)                                                            \
  X(cuInit) X(cuDriverGetVersion) X(cuGetErrorName) X(cuGetErrorString)                          \
  X(cuDeviceGetCount) X(cuDeviceGet) X(cuDeviceGetName) X(cuDeviceTotalMem)                      \
  X(cuDeviceGetAttribute) X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease)              \
  X(cuCtxSetCurrent) X(cuCtxSynchronize) X(cuMemGetInfo) X(cuMemGetAllocationGranularity)       \
  X(cuMemCreate) X(cuMemRelease) X(cuMemExportToShareableHandle)                                 \
  X(cuMemImportFromShareableHandle) X(cuMemAddressReserve) X(cuMemAddressFree) X(cuMemMap)     \
  X(cuMemUnmap) X(cuMemSetAccess) X(cuMemAlloc) X(cuMemFree) X(cuIpcGetMemHandle)               \
  X(cuIpcOpenMemHandle) X(cuIpcCloseMemHandle) X(cuMemHostAlloc) X(cuMemFreeHost)              \
  X(cuMemcpyHtoD) X(cuMemcpyDtoH) X(cuMemsetD8) X(cuStreamCreate) X(cuStreamDestroy)           \
  X(cuStreamSynchronize) X(cuMemcpyHtoDAsync) X(cuMemcpyDtoHAsync) X(cuMemsetD8Async)             \
  X(cuMemHostRegister) X(cuMemHostUnregister)

class CudaDriver {
 public:
  // The process's driver: loads libcuda.so.1 and calls cuInit(0) on first use. UNAVAILABLE with a
  // message that says what is missing (no driver installed, no device, a driver older than the
  // calls warmpool needs); the same answer on every later call.
  static Result<const CudaDriver*> Get();

  // OK, or a Status whose code follows the error (out of memory: RESOURCE_EXHAUSTED; no device or
  // driver: UNAVAILABLE; a bad argument: INVALID_ARGUMENT; anything else: INTERNAL) and whose
  // message reads "what: CUDA_ERROR_OUT_OF_MEMORY (out of memory)".
  Status Check(CUresult result, std::string_view what) const;
  // "CUDA_ERROR_OUT_OF_MEMORY (out of memory)"
  std::string Describe(CUresult result) const;

  int version() const { return version_; }  // cuDriverGetVersion: 13000 is CUDA 13.0

  // One pointer per call, named as cuda.h names it (cuMemGetInfo is the member cuMemGetInfo_v2,
  // and a call written driver->cuMemGetInfo(...) expands to it).
#define WARMPOOL_CUDA_MEMBER(name) decltype(&::name) name = nullptr;
  WARMPOOL_CUDA_DRIVER_CALLS(WARMPOOL_CUDA_MEMBER)
#undef WARMPOOL_CUDA_MEMBER

 private:
  CudaDriver() = default;
  static Result<const CudaDriver*> Load();
  int version_ = 0;
};

}  // namespace warmpool
