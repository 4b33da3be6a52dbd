// A legacy CUDA IPC handle (64 bytes, cuIpcGetMemHandle) and the size it names, as a descriptor:
// a small sealed memfd. The supervisor holds every weights handle as a descriptor, whichever way
// the device shares memory, so a legacy handle travels and is held like an exported allocation.
// Nothing here touches CUDA: warmpoold makes these from what a device's owner tells it.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace warmpool {

inline constexpr size_t kLegacyHandleBytes = 64;

Result<int> LegacyHandleToFd(const std::string& handle, uint64_t bytes);
// The 64 handle bytes; INVALID_ARGUMENT when fd holds no handle.
Result<std::string> LegacyHandleFromFd(int fd);

}  // namespace warmpool
