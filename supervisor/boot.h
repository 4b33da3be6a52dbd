// What warmpoold checks before it starts anything, in one place and in order, and
// `warmpoold --check` (as `nginx -t`): the same checks without starting. Each failure is a typed
// error that says what to do. Nothing here binds, spawns, maps or writes: Daemon::Start runs
// CheckBoot first, so a configuration that passes --check fails at start only for what exists
// only then (another daemon on the socket, the service manager's environment, the device probe).
#pragma once

#include <sys/types.h>

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "supervisor/client_server.h"
#include "supervisor/config.h"
#include "supervisor/worker_pool.h"

namespace warmpool::supervisor {

// What the checks found that the start needs.
struct BootPlan {
  std::optional<gid_t> admin_gid;     // [access] admin_group
  std::optional<gid_t> socket_gid;    // [access] socket_group
  std::optional<gid_t> observer_gid;  // [access] observer_group
  std::string admin_token;            // [http] admin_token_file's token; empty without one
  std::vector<std::string> api_keys;  // [http] api_keys_file's keys; empty without one
  std::string owner_path;             // warmpool-owner, next to the worker (cuda)
};

// In order: the worker binary, the groups, the admin token file, the socket path, the HTTP
// address, the takeover's flags; the first failure is returned.
Result<BootPlan> CheckBoot(const Config& config, const std::string& worker_path);

// What the listeners and sessions start with (the loop's parts, batcher and metrics, are the
// daemon's to add), and the worker pool's for these devices' budgets, once the backend is resolved
// (config.backend "host" or "cuda", config.cuda_sharing "vmm" or "legacy").
ClientServer::Options ServerOptions(const Config& config, const BootPlan& plan);
WorkerPoolOptions PoolOptions(const Config& config, const std::string& worker_path,
                              const std::vector<uint64_t>& budgets);

// `warmpoold --check`: CheckBoot, then the models the registry would hold (each file's header read
// as at start), written to `out`. Returns the exit status: 0 when the daemon would start (models
// with a problem are listed: they register as failed and do not stop a start), 1 when it would not.
int RunCheck(const Config& config, const std::string& worker_path, std::FILE* out);

}  // namespace warmpool::supervisor
