// Which backend serves, decided at start. warmpoold never loads the CUDA driver itself (a driver
// fault must not reach the process that holds the state, and a process that called cuInit must
// not fork CUDA children), so it asks a short-lived child: `warmpool-owner --probe`, which prints
// the machine's devices as JSON and exits.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/backend.h"
#include "common/status.h"

namespace warmpool::supervisor {

struct ProbedDevice {
  uint32_t ordinal = 0;
  std::string name;
  uint64_t total_bytes = 0;
  uint64_t free_bytes = 0;
  uint64_t granularity = 0;
  bool fd_handles = false;
};

// Runs `owner_path --probe` with a timeout. UNAVAILABLE with the child's own explanation (no
// driver, no device) or why it could not run.
Result<std::vector<ProbedDevice>> ProbeDevices(const std::string& owner_path, uint64_t timeout_ms);

struct BackendChoice {
  bool cuda = false;
  std::vector<ProbedDevice> devices;  // cuda only
  std::string why;                    // for the log: what was found, and why this backend
};

// Host: host. Cuda: cuda, or FAILED_PRECONDITION saying why not. Auto: cuda when a build with the
// cuda backend finds a usable device, host otherwise.
Result<BackendChoice> ChooseBackend(Backend asked, const std::string& owner_path);

}  // namespace warmpool::supervisor
