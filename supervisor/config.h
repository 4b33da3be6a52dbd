// Daemon configuration: embedded defaults, then the TOML file, then command-line flags. Every
// field has a default that works with no file at all.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/backend.h"
#include "common/status.h"

namespace warmpool::supervisor {

// keep_alive values: milliseconds after a model's last request ends; < 0 keeps it until evicted.
inline constexpr int64_t kKeepAliveForever = -1;
inline constexpr int64_t kKeepAliveDefault = INT64_MIN;

struct ModelConfig {
  std::string name;
  // Empty: decided by what path is (a model directory: transformer; a safetensors file: its
  // metadata's "engine", else dense), as for a model found in the models directory.
  std::string engine;
  std::string path;  // relative paths are resolved against the config file's directory
  int64_t keep_alive_ms = kKeepAliveDefault;  // kKeepAliveDefault: the pool's
  uint32_t replicas = 1;  // workers serving it from one copy of the weights
  int64_t max_batch_delay_us = -1;  // -1: the pool's
  // "hermes", "llama3_json" or "none": how its calls of tools are read (empty: as its chat
  // template shows).
  std::string tool_call_format{};
  // Language models: generations each replica runs at once, stepped together (continuous
  // batching), each with a KV cache of the whole context, 1 to 16; 0: the engine's default (4 on
  // the CPU).
  uint32_t parallel = 0;
  // Language models: positions the KV cache of a replica holds in all, shared by its `parallel`
  // generations (each admitted while the cache has the blocks it may come to need); 0: every
  // generation's whole context. At least one context is kept, and more than parallel x context
  // is not.
  uint64_t kv_cache_tokens = 0;
  // Language models: how many times a decode step a step may take that carries a prompt's piece
  // beside decoding generations (their gaps between tokens stretch by about that much while a long
  // prompt goes in; more lets the prompt in sooner), 1 to 100; 0: the engine's default (2).
  float prefill_stretch = 0;
  // Other names requests may use for it (as llama-swap's aliases: "gpt-4o-mini" for a local
  // model, so that a client's configured name reaches it). A registered model of that name wins.
  std::vector<std::string> aliases{};
};

// One device as the daemon found it at start (never read from a file).
struct DeviceConfig {
  std::string name;          // empty on the host backend
  uint64_t total_bytes = 0;  // 0: not known (host)
  uint64_t budget_bytes = 0; // resolved: the configured budget or the device's default; 0 unlimited
};

struct Config {
  std::string socket_path;    // default: DefaultSocketPath() (common/paths.h)
  std::string models_dir = "models";
  Backend backend = Backend::kAuto;  // as asked; resolved to host or cuda at start
  std::string instance = "default";
  uint32_t workers_per_device = 2;
  // Threads each worker computes with (the dense engine's layers); 0: the CPUs this daemon may
  // run on divided among all its workers, at least 1, so that workers never oversubscribe them.
  uint32_t threads_per_worker = 0;
  uint32_t default_deadline_ms = 30000;
  // Engine plugins: an engine name that is not built in loads from <engine_dir>/<name>.so (the
  // resolved file must lie inside engine_dir). Empty: built-in engines only.
  std::string engine_dir;
  // SIGTERM: requests in flight get this long to finish before workers are stopped (TERM, then
  // KILL after stop_kill_ms).
  uint32_t drain_timeout_ms = 10000;
  uint32_t stop_kill_ms = 3000;
  // pool
  uint32_t capacity = 0;         // models resident on a device at once; 0 = unlimited
  // Per device; 0 = the default: a quarter of physical memory (host backend), or each device's free
  // memory at start less cuda_reserve_bytes (cuda). budget_is_default says which it was; the
  // budget each device got is in `devices`.
  uint64_t budget_bytes = 0;
  bool budget_is_default = false;
  uint32_t max_queue = 1024;     // requests waiting for a load or for room
  int64_t keep_alive_ms = kKeepAliveForever;  // default of every model
  uint64_t park_budget_bytes = 0;  // host copies of parked models; 0: no parking
  bool single_active = false;      // at most one model on the device; switching parks it
  uint32_t max_cached = 0;         // models on the device plus parked; 0 = unlimited
  std::vector<std::string> preload;  // loaded at start
  // Dynamic batching: requests for one model that meet at a worker are computed in one engine
  // call. A request another of the model's requests is in flight beside waits up to this long
  // for more to join it; 0 turns batching off.
  uint32_t max_batch_delay_us = 500;
  // What serves, as the daemon found it at start (never read from a file): the backend (host or
  // cuda once resolved) and its devices, workers_per_device workers each (worker slot s
  // serves device s / workers_per_device). Empty: one device of budget_bytes.
  std::vector<DeviceConfig> devices;
  // cuda backend
  std::string cuda_sharing = "auto";          // [cuda] sharing: auto | vmm | legacy
  uint64_t cuda_reserve_bytes = 1ull << 30;   // [cuda] reserve: left free on each device
  bool cuda_tf32 = false;                     // [cuda] tf32: f32 dense layers on TF32 tensor cores
  // [cuda] keep_across_restarts: device weights (vmm sharing) kept across a restart of warmpoold,
  // which relies on an allocation outliving the owner that made it (warmpool-driver-check lifetime).
  bool cuda_keep_across_restarts = false;
  // limits
  uint32_t max_frame_bytes = 64u << 20;
  uint32_t max_connections = 1024;
  uint32_t max_models = 256;
  uint32_t max_inflight = 1024;
  uint32_t max_requests_per_connection = 256;  // unanswered requests one client may have
  // Bytes of requests the daemon holds (waiting or running): in all, and for one connection.
  // Beyond them a request is answered RESOURCE_EXHAUSTED. At least max_frame_bytes each.
  // Unless configured, FinishDefaults makes max_queued_bytes a 64th of physical memory, between
  // 256 MiB and 1 GiB (it also bounds the replies left unread by all clients together).
  uint64_t max_queued_bytes = 1ull << 30;
  bool max_queued_bytes_configured = false;
  uint64_t max_queued_bytes_per_connection = 256ull << 20;
  // Replies a client has not read: past this it is cut off (at least max_frame_bytes + 64 KiB).
  uint64_t max_unread_reply_bytes = 128ull << 20;
  // Each peer's share (a local user; all loopback TCP clients together), docs/limits.md. 0 here:
  // FinishDefaults makes it a quarter of what it divides (connections: of max_connections, and
  // of half the descriptors the daemon may open; requests: of [pool] max_queue + max_inflight;
  // bytes: of max_queued_bytes, at least one frame).
  uint32_t max_connections_per_peer = 0;
  uint32_t max_requests_per_peer = 0;
  uint64_t max_queued_bytes_per_peer = 0;
  uint64_t max_unread_reply_bytes_per_peer = 0;
  // Connections kept beyond the shares for /metrics scrapes and for telling clients past a
  // share why they are refused; one descriptor is held open for each.
  uint32_t reserved_connections = 16;
  // A request (or a connection's first bytes) must be complete this long after its first byte.
  uint64_t request_read_timeout_ms = 10'000;
  // A connection with no request outstanding for this long is closed; 0: never.
  uint64_t idle_timeout_ms = 0;
  // access: root, the daemon's own user and members of admin_group may load, unload, pin and arm
  // faults; every other local user may infer and read status.
  std::string admin_group;
  std::string socket_group;    // the client socket is 0660 to this group (else 0600)
  std::string observer_group;  // the segment is 0640 to this group (else 0600)
  // Model files must resolve (symlinks followed) inside one of these directories. Empty: the
  // models directory and the directory of the config file.
  std::vector<std::string> model_roots;
  // http: the HTTP/JSON API and /metrics on a loopback TCP address too (they are always on the
  // Unix socket); "" for none. Over TCP only reads and infer, unless a request carries the admin
  // token (the first line of admin_token_file) as "Authorization: Bearer TOKEN".
  // With api_keys_file (keys one per line, chmod 600), every TCP request needs one of its keys as
  // "Authorization: Bearer KEY" (or the admin token), and listen may be any address; without, only
  // loopback; the file is read again at every SIGHUP. cors_origins: web pages from these origins
  // ("*": any) may call the API.
  std::string http_listen;
  std::string http_admin_token_file;
  std::string http_api_keys_file;
  std::vector<std::string> http_cors_origins;
  // recovery
  bool enable_fault_injection = false;  // only from the command line, never from a file
  bool takeover = false;  // --takeover (supervisor/takeover.h); only from the command line
  uint32_t inference_grace_ms = 1000;   // past a request's deadline, a worker still on it is killed
  uint32_t load_stall_ms = 30000;       // a load (or unload) with no progress this long is killed
  uint32_t crash_loop_crashes = 3;      // this many worker crashes caused by one model ...
  uint32_t crash_loop_window_ms = 60000;  // ... within this window mark it failed
  uint32_t failed_cooldown_ms = 5000;   // first cooldown of a failed model; doubles each time
  uint32_t failed_cooldown_max_ms = 300000;
  uint32_t respawn_min_ms = 100;        // worker respawn backoff: doubles per crash ...
  uint32_t respawn_max_ms = 30000;      // ... up to this, and resets after
  uint32_t respawn_stable_ms = 60000;   // ... a worker that lived this long
  std::vector<ModelConfig> models;
  std::string config_path;       // the file read, empty when none
};

// Applies a TOML document on top of config. Unknown keys are errors (a typo must not be ignored).
Status ApplyToml(Config& config, const std::string& text, const std::string& origin);
Status LoadConfigFile(Config& config, const std::string& path);
// Instance names become part of a /dev/shm name: 1..32 of [A-Za-z0-9_-].
Status CheckInstanceName(const std::string& instance);
// Fills the defaults that depend on the machine (socket path, budget, client byte limits and
// shares).
void FinishDefaults(Config& config);
// The client limits' defaults and each peer's share, for a machine of physical_bytes of memory
// and a daemon that may open open_files descriptors (FinishDefaults passes this machine's).
void FinishShares(Config& config, uint64_t physical_bytes, uint64_t open_files);
// What a reload (SIGHUP) takes from a config file read again: the registry's settings (models,
// models_dir, model_roots, keep_alive). The daemon also reads the API keys and admin token files
// again (ReloadApiKeys, ReloadAdminToken: supervisor/http_access.h). Everything else needs a
// restart. Inline: the core, which does not link the config parser, applies it too.
inline void TakeRegistrySettings(Config& config, const Config& from) {
  config.models = from.models;
  config.models_dir = from.models_dir;
  config.model_roots = from.model_roots;
  config.keep_alive_ms = from.keep_alive_ms;
}

// The threads each of `workers` workers computes with: `configured`, or when 0 the CPUs this
// process may run on (its affinity mask) divided among them, at least 1.
uint32_t ThreadsPerWorker(uint32_t configured, size_t workers);

}  // namespace warmpool::supervisor
