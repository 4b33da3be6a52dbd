#include "supervisor/boot.h"

#include <grp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <vector>

#include <fmt/format.h>

#include "common/units.h"
#include "supervisor/http_access.h"
#include "supervisor/listen_address.h"
#include "supervisor/model_roots.h"
#include "supervisor/registry.h"

namespace warmpool::supervisor {

namespace {

Result<gid_t> LookupGroup(const std::string& name, const std::string& key) {
  group* g = getgrnam(name.c_str());
  if (g == nullptr) {
    return Error(Code::kFailedPrecondition,
                 "[access] {} \"{}\" is not a group on this machine: create it (groupadd {}) or "
                 "fix the name",
                 key, name, name);
  }
  return g->gr_gid;
}

}  // namespace

Result<BootPlan> CheckBoot(const Config& config, const std::string& worker_path) {
  BootPlan plan;
  if (access(worker_path.c_str(), X_OK) != 0) {
    return Error(Code::kFailedPrecondition,
                 "worker binary {} is missing or not executable: install warmpool-worker next to "
                 "warmpoold or pass --worker",
                 worker_path);
  }
  plan.owner_path = worker_path.substr(0, worker_path.rfind('/') + 1) + "warmpool-owner";
  for (auto [name, key, gid] : {std::tuple{&config.admin_group, "admin_group", &plan.admin_gid},
                                std::tuple{&config.socket_group, "socket_group", &plan.socket_gid},
                                std::tuple{&config.observer_group, "observer_group", &plan.observer_gid}}) {
    if (name->empty()) continue;
    Result<gid_t> g = LookupGroup(*name, key);
    if (!g.ok()) return g.status();
    *gid = *g;
  }
  if (!config.http_admin_token_file.empty()) {
    Result<std::string> token = ReadAdminToken(config.http_admin_token_file);
    if (!token.ok()) return token.status();
    plan.admin_token = *token;
  }
  if (!config.http_api_keys_file.empty()) {
    Result<std::vector<std::string>> keys = ReadApiKeys(config.http_api_keys_file);
    if (!keys.ok()) return keys.status();
    plan.api_keys = std::move(*keys);
  }
  if (Status s = CheckSocketPath(config.socket_path); !s.ok()) return s;
  if (!config.http_listen.empty()) {
    Result<sockaddr_storage> a = ParseListenAddress(config.http_listen, /*with_api_keys=*/!plan.api_keys.empty());
    if (!a.ok()) return a.status();
  }
  return plan;
}

ClientServer::Options ServerOptions(const Config& config, const BootPlan& plan) {
  ClientServer::Options o;
  o.max_frame_bytes = config.max_frame_bytes;
  o.max_connections = config.max_connections;
  o.max_requests_per_connection = config.max_requests_per_connection;
  o.max_unread_reply_bytes = config.max_unread_reply_bytes;
  o.max_unread_reply_bytes_total = config.max_queued_bytes;
  o.idle_timeout_ms = config.idle_timeout_ms;
  o.max_connections_per_peer = config.max_connections_per_peer;
  o.max_requests_per_peer = config.max_requests_per_peer;
  o.max_queued_bytes_per_peer = config.max_queued_bytes_per_peer;
  o.max_unread_reply_bytes_per_peer = config.max_unread_reply_bytes_per_peer;
  o.reserved_connections = config.reserved_connections;
  o.request_read_timeout_ms = config.request_read_timeout_ms;
  o.admin_token = plan.admin_token;
  o.api_keys = plan.api_keys;
  o.cors_origins = config.http_cors_origins;
  return o;
}

WorkerPoolOptions PoolOptions(const Config& config, const std::string& worker_path,
                              const std::vector<uint64_t>& budgets) {
  WorkerPoolOptions pool;
  pool.worker_path = worker_path;
  pool.instance = config.instance;
  pool.engine_dir = config.engine_dir;
  pool.workers_per_device = config.workers_per_device;
  pool.device_budgets = budgets;
  pool.max_frame_bytes = config.max_frame_bytes;
  pool.threads = ThreadsPerWorker(config.threads_per_worker, config.workers_per_device * budgets.size());
  // As resolved by the start (CudaDevices::Configure): host or cuda, and cuda's sharing.
  pool.backend = config.backend;
  if (config.backend == Backend::kCuda) {
    pool.sharing = config.cuda_sharing;
    pool.tf32 = config.cuda_tf32;
  }
  return pool;
}

int RunCheck(const Config& config, const std::string& worker_path, std::FILE* out) {
  const std::string origin = config.config_path.empty() ? "flags and defaults" : config.config_path;
  Result<BootPlan> plan = CheckBoot(config, worker_path);
  if (!plan.ok()) {
    fmt::print(out, "warmpoold: the configuration ({}) would not start: {}\n", origin, plan.status().message());
    return 1;
  }
  std::vector<std::string> warnings;
  const ModelRoots roots(EffectiveModelRoots(config));
  const std::vector<ModelEntry> entries = DiscoverModels(config, roots, warnings);
  fmt::print(out, "warmpoold: the configuration ({}) is valid\n", origin);
  fmt::print(out, "  socket {}, instance {}, backend {}, budget {}{}\n", config.socket_path, config.instance,
             BackendName(config.backend), FormatBytes(config.budget_bytes),
             config.http_listen.empty() ? "" : fmt::format(", HTTP on {}", config.http_listen));
  size_t broken = 0;
  for (const ModelEntry& e : entries) broken += !e.problem.ok();
  fmt::print(out, "  {} models{}\n", entries.size(),
             broken == 0 ? "" : fmt::format(", {} of them would register as failed", broken));
  for (const ModelEntry& e : entries) {
    if (e.problem.ok()) {
      fmt::print(out, "    {:<24} {} weights {}, workspace {}\n", e.name, e.engine, FormatBytes(e.weight_bytes),
                 FormatBytes(e.workspace_bytes));
    } else {
      fmt::print(out, "    {:<24} FAILED: {}\n", e.name, e.problem.message());
    }
  }
  for (const std::string& w : warnings) fmt::print(out, "  warning: {}\n", w);
  return 0;
}

}  // namespace warmpool::supervisor
