// The cuda backend's decisions about a device's memory owner, as pure functions (the shell's
// CudaDevices carries them out): when an owner that died is started again, and whether a worker's
// ask for device memory goes to its device's owner or is refused, and why.
#pragma once

#include <cstdint>

#include "common/status.h"
#include "supervisor/policy/retry.h"

namespace warmpool::supervisor::policy {

// An owner that died young (a broken driver) waits, doubling, before it starts again; one that
// lived kOwnerRespawn.respawn_stable_ms died of something else and starts again at once.
inline constexpr RetrySettings kOwnerRespawn{.respawn_min_ms = 100, .respawn_max_ms = 30000,
                                             .respawn_stable_ms = 10000};
// Allocations wait for an owner that starts again within this; beyond it they fail at once.
inline constexpr uint64_t kOwnerPatienceMs = 1000;

struct GrantAsk {
  uint32_t slot = 0;
  uint32_t device = 0;     // the worker's own: a worker gets memory on its own device only
  uint64_t bytes = 0;      // asked
  uint64_t held = 0;       // granted to this worker and not yet weights the core holds
  uint64_t budget = 0;     // the device's; 0 unlimited
  bool owner_fatal = false;          // exited with status 2: never started again
  bool owner_running = true;
  uint64_t owner_restart_delay_ms = 0;  // while it is down: when it starts again
};
// OK: ask the owner (or wait for it while it restarts). Admission counted what a load needs; an
// engine asking for more than the whole budget beside what it holds is broken (or hostile) and
// must not take the device from everyone else.
Status AdmitGrant(const GrantAsk& ask);

}  // namespace warmpool::supervisor::policy
