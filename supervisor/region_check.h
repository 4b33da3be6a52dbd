// What the shell checks of a client's shared-memory region (RegionRequest) before the core keeps
// it and workers map it.
#pragma once

#include <cstdint>

#include "common/status.h"

namespace warmpool::supervisor {

// A memfd (workers map it shared), sealed against shrinking (a worker mapping a slice past a
// shrunk end would die of SIGBUS in the middle of a request), not sealed against writing (outputs
// go there), and at least `bytes` long. Errors say what the client should do.
Status CheckClientRegion(int fd, uint64_t bytes);

}  // namespace warmpool::supervisor
