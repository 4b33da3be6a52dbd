// The one readiness check for whatever starts a daemon: `warmpool status --wait` (scripts, the
// Python tests, the documentation's examples) and launch/daemon_process.h (the C++ tests, the
// harness, the bench). A starting daemon may not have its socket yet, or not accept yet, or not
// have its workers up; waiting is asking again every 20 ms until the deadline.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "client/client.h"
#include "common/status.h"

namespace warmpool::client {

struct ReadyWait {
  int64_t wait_ms = 0;
  // Also until the status reports every worker idle (up, and no job): the daemon serves its first
  // request without waiting for a worker to start.
  bool workers_idle = false;
  // Asked before every try: an error ends the wait with it (the daemon the caller started exited).
  std::function<Status()> still_starting;
};

// A connection to a daemon that has answered a status request (and met the condition), or
// UNAVAILABLE naming what the last try saw. A daemon that answers with an error other than
// UNAVAILABLE (it refuses this user) has answered: that error is returned at once, since waiting
// longer would only hide why. A socket that accepts and never answers cannot hold the wait past
// its deadline.
Result<std::unique_ptr<Client>> ConnectWhenReady(const std::string& socket, const ReadyWait& wait);

}  // namespace warmpool::client
