#include "supervisor/config.h"

#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <set>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <toml++/toml.h>

#include "common/paths.h"
#include "common/units.h"
#include "engines/chat_template/tool_calls.h"
#include "supervisor/core/model_entry.h"

namespace warmpool::supervisor {

namespace {

uint64_t PhysicalMemoryBytes() {
  long pages = sysconf(_SC_PHYS_PAGES);
  long page = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return 4ull << 30;
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page);
}

// Reads a size given as an integer (bytes) or a string ("512MiB").
Status ReadBool(const toml::node& node, const std::string& key, bool& out) {
  std::optional<bool> v = node.value_exact<bool>();
  if (!v) return Error(Code::kInvalidArgument, "{} must be true or false", key);
  out = *v;
  return OkStatus();
}

Status ReadSize(const toml::node& node, const std::string& key, uint64_t& out) {
  // value_exact: the permissive value<int64_t>() would take `true` as 1 and 2.0 as 2.
  if (auto v = node.value_exact<int64_t>()) {
    if (*v < 0) return Error(Code::kInvalidArgument, "{} must not be negative", key);
    out = static_cast<uint64_t>(*v);
    return OkStatus();
  }
  if (auto s = node.value<std::string>()) {
    Result<uint64_t> size = ParseSize(*s);
    if (!size.ok()) return Error(Code::kInvalidArgument, "{}: {}", key, size.status().message());
    out = *size;
    return OkStatus();
  }
  return Error(Code::kInvalidArgument, "{} must be a size such as 2GiB or a byte count", key);
}

// A whole number in [0, most]: for settings where a larger one is a mistake, not a wish.
template <typename T>
Status ReadUintAtMost(const toml::node& node, const std::string& key, T& out, uint64_t most) {
  auto v = node.value_exact<int64_t>();
  if (!v || *v < 0 || static_cast<uint64_t>(*v) > most) {
    return Error(Code::kInvalidArgument, "{} must be an integer from 0 to {}", key, most);
  }
  out = static_cast<T>(*v);
  return OkStatus();
}

// The most threads a worker takes (warmpool-worker --threads) and the longest batching wait.
constexpr uint64_t kMaxThreadsPerWorker = 4096;
constexpr uint64_t kMaxBatchDelayUs = 1000000;
// [[models]] parallel: at most the jobs the daemon lets wait in one worker (kWorkerWindowJobs in
// supervisor/core/core.h): more would be counted by admission and never run at once.
constexpr uint64_t kMaxParallel = 16;
// [[models]] kv_cache_tokens: far past any context times kMaxParallel.
constexpr uint64_t kMaxKvCacheTokens = uint64_t{1} << 30;
// Each reserve place holds a descriptor open: a reserve larger than this is a mistake.
constexpr uint64_t kMaxReservedConnections = 1024;

uint64_t OpenFilesLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return 1 << 20;
  return limit.rlim_cur;
}

template <typename T>
Status ReadUint(const toml::node& node, const std::string& key, T& out) {
  auto v = node.value_exact<int64_t>();  // not value<>(): `true` must not read as 1
  if (!v || *v < 0 || static_cast<uint64_t>(*v) > std::numeric_limits<T>::max()) {
    return Error(Code::kInvalidArgument, "{} must be a non-negative integer", key);
  }
  out = static_cast<T>(*v);
  return OkStatus();
}

// A number (integer or not) from `least` to `most`.
Status ReadRatio(const toml::node& node, const std::string& key, float& out, double least, double most) {
  std::optional<double> value = node.value<double>();
  if (!value || !(*value >= least && *value <= most)) {
    return Error(Code::kInvalidArgument, "{} must be a number from {} to {}", key, least, most);
  }
  out = static_cast<float>(*value);
  return OkStatus();
}

Status ReadString(const toml::node& node, const std::string& key, std::string& out) {
  auto v = node.value<std::string>();
  if (!v) return Error(Code::kInvalidArgument, "{} must be a string", key);
  out = *v;
  return OkStatus();
}

// "5m", "30s", "1h", "250ms", an integer of seconds, or -1 (until evicted).
Status ReadKeepAlive(const toml::node& node, const std::string& key, int64_t& out) {
  if (auto v = node.value_exact<int64_t>()) {
    // The bound of the string form ("duration is too long" past 1e15 ms); * 1000 must not overflow.
    if (*v > 1'000'000'000'000) return Error(Code::kInvalidArgument, "{}: {} seconds is too long", key, *v);
    out = *v < 0 ? kKeepAliveForever : *v * 1000;
    return OkStatus();
  }
  if (auto s = node.value<std::string>()) {
    Result<int64_t> ms = ParseDurationMs(*s);
    if (!ms.ok()) return Error(Code::kInvalidArgument, "{}: {}", key, ms.status().message());
    out = *ms;
    return OkStatus();
  }
  return Error(Code::kInvalidArgument, "{} must be a duration such as \"5m\" or -1 (until evicted)", key);
}

// "10m", "30s", "250ms", an integer of seconds, or 0 (never).
Status ReadDurationMs(const toml::node& node, const std::string& key, uint64_t& out) {
  if (auto v = node.value_exact<int64_t>()) {
    if (*v < 0 || *v > 1'000'000'000'000) {
      return Error(Code::kInvalidArgument, "{} must be 0 (never) or a positive number of seconds", key);
    }
    out = static_cast<uint64_t>(*v) * 1000;
    return OkStatus();
  }
  if (auto s = node.value<std::string>()) {
    Result<int64_t> ms = ParseDurationMs(*s);
    if (!ms.ok()) return Error(Code::kInvalidArgument, "{}: {}", key, ms.status().message());
    if (*ms < 0) return Error(Code::kInvalidArgument, "{} must not be negative", key);
    out = static_cast<uint64_t>(*ms);
    return OkStatus();
  }
  return Error(Code::kInvalidArgument, "{} must be a duration such as \"10m\" or 0 (never)", key);
}

Status ReadBackend(const toml::node& node, const std::string& key, Backend& out) {
  std::string name;
  if (Status s = ReadString(node, key, name); !s.ok()) return s;
  std::optional<Backend> backend = ParseBackend(name);
  if (!backend) return Error(Code::kInvalidArgument, "{} must be auto, host or cuda, not \"{}\"", key, name);
  out = *backend;
  return OkStatus();
}

Status ReadStrings(const toml::node& node, const std::string& key, std::vector<std::string>& out) {
  const toml::array* array = node.as_array();
  if (array == nullptr) return Error(Code::kInvalidArgument, "{} must be a list of strings", key);
  out.clear();
  for (const toml::node& item : *array) {
    auto v = item.value<std::string>();
    if (!v) return Error(Code::kInvalidArgument, "{} must be a list of strings", key);
    out.push_back(*v);
  }
  return OkStatus();
}

Status ApplyTable(Config& c, const toml::table& table, const std::string& section) {
  for (const auto& [k, node] : table) {
    std::string key = section + "." + std::string(k.str());
    Status s;
    if (section == "daemon") {
      if (k == "socket") s = ReadString(node, key, c.socket_path);
      else if (k == "models_dir") s = ReadString(node, key, c.models_dir);
      else if (k == "backend") s = ReadBackend(node, key, c.backend);
      else if (k == "instance") s = ReadString(node, key, c.instance);
      else if (k == "workers_per_device") s = ReadUint(node, key, c.workers_per_device);
      else if (k == "threads_per_worker") s = ReadUintAtMost(node, key, c.threads_per_worker, kMaxThreadsPerWorker);
      else if (k == "default_deadline_ms") s = ReadUint(node, key, c.default_deadline_ms);
      else if (k == "engine_dir") s = ReadString(node, key, c.engine_dir);
      else if (k == "drain_timeout_ms") s = ReadUint(node, key, c.drain_timeout_ms);
      else if (k == "stop_kill_ms") s = ReadUint(node, key, c.stop_kill_ms);
      else s = Error(Code::kInvalidArgument, "unknown key {}", key);
    } else if (section == "pool") {
      if (k == "capacity") s = ReadUint(node, key, c.capacity);
      else if (k == "budget") s = ReadSize(node, key, c.budget_bytes);
      else if (k == "max_queue") s = ReadUint(node, key, c.max_queue);
      else if (k == "keep_alive") s = ReadKeepAlive(node, key, c.keep_alive_ms);
      else if (k == "preload") s = ReadStrings(node, key, c.preload);
      else if (k == "park_budget") s = ReadSize(node, key, c.park_budget_bytes);
      else if (k == "max_batch_delay_us") s = ReadUintAtMost(node, key, c.max_batch_delay_us, kMaxBatchDelayUs);
      else if (k == "max_cached") s = ReadUint(node, key, c.max_cached);
      else if (k == "single_active") s = ReadBool(node, key, c.single_active);
      else s = Error(Code::kInvalidArgument, "unknown key {}", key);
    } else if (section == "access") {
      if (k == "admin_group") s = ReadString(node, key, c.admin_group);
      else if (k == "socket_group") s = ReadString(node, key, c.socket_group);
      else if (k == "observer_group") s = ReadString(node, key, c.observer_group);
      else if (k == "model_roots") s = ReadStrings(node, key, c.model_roots);
      else s = Error(Code::kInvalidArgument, "unknown key {}", key);
    } else if (section == "http") {
      if (k == "listen") s = ReadString(node, key, c.http_listen);
      else if (k == "admin_token_file") s = ReadString(node, key, c.http_admin_token_file);
      else if (k == "api_keys_file") s = ReadString(node, key, c.http_api_keys_file);
      else if (k == "cors_origins") s = ReadStrings(node, key, c.http_cors_origins);
      else s = Error(Code::kInvalidArgument, "unknown key {}", key);
    } else if (section == "recovery") {
      if (k == "inference_grace_ms") s = ReadUint(node, key, c.inference_grace_ms);
      else if (k == "load_stall_ms") s = ReadUint(node, key, c.load_stall_ms);
      else if (k == "crash_loop_crashes") s = ReadUint(node, key, c.crash_loop_crashes);
      else if (k == "crash_loop_window_ms") s = ReadUint(node, key, c.crash_loop_window_ms);
      else if (k == "failed_cooldown_ms") s = ReadUint(node, key, c.failed_cooldown_ms);
      else if (k == "failed_cooldown_max_ms") s = ReadUint(node, key, c.failed_cooldown_max_ms);
      else if (k == "respawn_min_ms") s = ReadUint(node, key, c.respawn_min_ms);
      else if (k == "respawn_max_ms") s = ReadUint(node, key, c.respawn_max_ms);
      else if (k == "respawn_stable_ms") s = ReadUint(node, key, c.respawn_stable_ms);
      else s = Error(Code::kInvalidArgument, "unknown key {}", key);
    } else if (section == "cuda") {
      if (k == "sharing") {
        s = ReadString(node, key, c.cuda_sharing);
        if (s.ok() && c.cuda_sharing != "auto" && c.cuda_sharing != "vmm" && c.cuda_sharing != "legacy") {
          s = Error(Code::kInvalidArgument, "{} must be auto, vmm or legacy, not \"{}\"", key, c.cuda_sharing);
        }
      } else if (k == "reserve") s = ReadSize(node, key, c.cuda_reserve_bytes);
      else if (k == "tf32") s = ReadBool(node, key, c.cuda_tf32);
      else if (k == "keep_across_restarts") s = ReadBool(node, key, c.cuda_keep_across_restarts);
      else s = Error(Code::kInvalidArgument, "unknown key {}", key);
    } else if (section == "limits") {
      uint64_t size = 0;
      if (k == "max_frame_bytes") {
        s = ReadSize(node, key, size);
        if (s.ok() && (size < 1024 || size > (1ull << 31))) {
          s = Error(Code::kInvalidArgument, "{} must be between 1KiB and 2GiB", key);
        }
        c.max_frame_bytes = static_cast<uint32_t>(size);
      } else if (k == "max_connections") s = ReadUint(node, key, c.max_connections);
      else if (k == "max_models") s = ReadUint(node, key, c.max_models);
      else if (k == "max_inflight") s = ReadUint(node, key, c.max_inflight);
      else if (k == "max_requests_per_connection") s = ReadUint(node, key, c.max_requests_per_connection);
      else if (k == "max_queued_bytes") {
        s = ReadSize(node, key, c.max_queued_bytes);
        c.max_queued_bytes_configured = true;
      }
      else if (k == "max_queued_bytes_per_connection") s = ReadSize(node, key, c.max_queued_bytes_per_connection);
      else if (k == "max_unread_reply_bytes") s = ReadSize(node, key, c.max_unread_reply_bytes);
      else if (k == "idle_timeout") s = ReadDurationMs(node, key, c.idle_timeout_ms);
      else if (k == "max_connections_per_peer") s = ReadUint(node, key, c.max_connections_per_peer);
      else if (k == "max_requests_per_peer") s = ReadUint(node, key, c.max_requests_per_peer);
      else if (k == "max_queued_bytes_per_peer") s = ReadSize(node, key, c.max_queued_bytes_per_peer);
      else if (k == "max_unread_reply_bytes_per_peer") {
        s = ReadSize(node, key, c.max_unread_reply_bytes_per_peer);
      } else if (k == "reserved_connections") {
        s = ReadUintAtMost(node, key, c.reserved_connections, kMaxReservedConnections);
      } else if (k == "request_read_timeout") {
        s = ReadDurationMs(node, key, c.request_read_timeout_ms);
        if (s.ok() && (c.request_read_timeout_ms < 100 || c.request_read_timeout_ms > 3'600'000)) {
          s = Error(Code::kInvalidArgument, "{} must be between 100ms and 1h", key);
        }
      }
      else s = Error(Code::kInvalidArgument, "unknown key {}", key);
    }
    if (!s.ok()) return s;
  }
  return OkStatus();
}

Status ApplyModels(Config& c, const toml::node& node, const std::string& base_dir) {
  const toml::array* array = node.as_array();
  if (array == nullptr) {
    return Error(Code::kInvalidArgument, "models must be an array of tables ([[models]])");
  }
  for (const toml::node& item : *array) {
    const toml::table* t = item.as_table();
    if (t == nullptr) return Error(Code::kInvalidArgument, "each [[models]] entry must be a table");
    ModelConfig m;
    for (const auto& [k, v] : *t) {
      std::string key = "models." + std::string(k.str());
      Status s;
      if (k == "name") s = ReadString(v, key, m.name);
      else if (k == "engine") s = ReadString(v, key, m.engine);
      else if (k == "path") s = ReadString(v, key, m.path);
      else if (k == "keep_alive") s = ReadKeepAlive(v, key, m.keep_alive_ms);
      else if (k == "replicas") s = ReadUint(v, key, m.replicas);
      else if (k == "parallel") {
        s = ReadUintAtMost(v, key, m.parallel, kMaxParallel);
        if (s.ok() && m.parallel == 0) s = Error(Code::kInvalidArgument, "{} must be 1 to {}", key, kMaxParallel);
      }
      else if (k == "kv_cache_tokens") {
        s = ReadUintAtMost(v, key, m.kv_cache_tokens, kMaxKvCacheTokens);
        if (s.ok() && m.kv_cache_tokens == 0) {
          s = Error(Code::kInvalidArgument, "{} must be 1 to {} (leave it out for every generation's whole context)",
                    key, kMaxKvCacheTokens);
        }
      }
      else if (k == "prefill_stretch") s = ReadRatio(v, key, m.prefill_stretch, 1, 100);
      else if (k == "aliases") s = ReadStrings(v, key, m.aliases);
      else if (k == "tool_call_format") {
        s = ReadString(v, key, m.tool_call_format);
        if (s.ok() && !chat::ParseToolCallFormat(m.tool_call_format).ok()) {
          s = Error(Code::kInvalidArgument, "{} must be \"hermes\", \"llama3_json\" or \"none\", not \"{}\"", key,
                    m.tool_call_format);
        }
      }
      else if (k == "max_batch_delay_us") {
        uint32_t delay = 0;
        s = ReadUintAtMost(v, key, delay, kMaxBatchDelayUs);
        m.max_batch_delay_us = delay;
      }
      else s = Error(Code::kInvalidArgument, "unknown key {}", key);
      if (!s.ok()) return s;
    }
    if (m.name.empty()) return Error(Code::kInvalidArgument, "a [[models]] entry has no name");
    if (!m.path.empty() && m.path[0] != '/' && !base_dir.empty()) {
      m.path = (std::filesystem::path(base_dir) / m.path).lexically_normal().string();
    }
    c.models.push_back(std::move(m));
  }
  // An alias names one model: never a configured model's name, never twice.
  std::set<std::string> names;
  for (const ModelConfig& m : c.models) names.insert(m.name);
  for (const ModelConfig& m : c.models) {
    for (const std::string& alias : m.aliases) {
      if (Status s = CheckModelName(alias); !s.ok()) {
        return Error(Code::kInvalidArgument, "models.aliases of \"{}\": {}", m.name, s.message());
      }
      if (!names.insert(alias).second) {
        return Error(Code::kInvalidArgument,
                     "alias \"{}\" of model \"{}\" is already the name or an alias of a configured model", alias,
                     m.name);
      }
    }
  }
  return OkStatus();
}

}  // namespace

Status ApplyToml(Config& config, const std::string& text, const std::string& origin) {
  toml::table root;
  try {
    root = toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    return Error(Code::kInvalidArgument, "{}:{}:{}: {}", origin, e.source().begin.line,
                 e.source().begin.column, e.description());
  }
  std::string base_dir;
  if (!origin.empty()) base_dir = std::filesystem::path(origin).parent_path().string();
  for (const auto& [k, node] : root) {
    Status s;
    if (k == "daemon" || k == "pool" || k == "limits" || k == "recovery" || k == "access" || k == "cuda" ||
        k == "http") {
      const toml::table* t = node.as_table();
      if (t == nullptr) return Error(Code::kInvalidArgument, "{}: [{}] must be a table", origin, k.str());
      s = ApplyTable(config, *t, std::string(k.str()));
    } else if (k == "models") {
      s = ApplyModels(config, node, base_dir);
    } else {
      s = Error(Code::kInvalidArgument, "unknown section [{}]", k.str());
    }
    if (!s.ok()) return Error(Code::kInvalidArgument, "{}: {}", origin, s.message());
  }
  return OkStatus();
}

Status LoadConfigFile(Config& config, const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return Error(Code::kNotFound, "cannot read config file \"{}\": {}", path, std::strerror(errno));
  }
  std::stringstream text;
  text << in.rdbuf();
  config.config_path = path;
  return ApplyToml(config, text.str(), path);
}

Status CheckInstanceName(const std::string& instance) {
  bool ok = !instance.empty() && instance.size() <= 32;
  for (char c : instance) ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_');
  if (!ok) {
    return Error(Code::kInvalidArgument,
                 "instance name \"{}\" must be 1 to 32 letters, digits, '-' or '_'", instance);
  }
  return OkStatus();
}

void FinishDefaults(Config& config) {
  if (config.socket_path.empty()) config.socket_path = DefaultSocketPath();
  if (config.budget_bytes == 0) {
    config.budget_bytes = PhysicalMemoryBytes() / 4;  // the host backend's; cuda picks its own
    config.budget_is_default = true;
  }
  if (config.workers_per_device == 0) config.workers_per_device = 1;
  if (config.crash_loop_crashes == 0) config.crash_loop_crashes = 1;
  if (config.respawn_min_ms == 0) config.respawn_min_ms = 1;
  config.respawn_max_ms = std::max(config.respawn_max_ms, config.respawn_min_ms);
  config.failed_cooldown_max_ms = std::max(config.failed_cooldown_max_ms, config.failed_cooldown_ms);
  // A request as large as a frame may always be held, and its reply be unread.
  config.max_queued_bytes_per_connection =
      std::max<uint64_t>(config.max_queued_bytes_per_connection, config.max_frame_bytes);
  config.max_queued_bytes = std::max(config.max_queued_bytes, config.max_queued_bytes_per_connection);
  config.max_unread_reply_bytes =
      std::max<uint64_t>(config.max_unread_reply_bytes, uint64_t{config.max_frame_bytes} + (64u << 10));
  FinishShares(config, PhysicalMemoryBytes(), OpenFilesLimit());
}

void FinishShares(Config& c, uint64_t physical_bytes, uint64_t open_files) {
  // Client bytes the daemon holds (requests waiting or running, and replies unread, each up to
  // max_queued_bytes) in proportion to the machine: at most a 32nd of it by default.
  if (!c.max_queued_bytes_configured) {
    c.max_queued_bytes = std::clamp<uint64_t>(physical_bytes / 64, 256ull << 20, 1ull << 30);
  }
  const uint64_t frame = c.max_frame_bytes;
  c.max_queued_bytes_per_connection = std::max(c.max_queued_bytes_per_connection, frame);
  c.max_queued_bytes = std::max(c.max_queued_bytes, c.max_queued_bytes_per_connection);
  // A peer's share is a quarter: one user (or all TCP clients) pushing as hard as it can leaves
  // three quarters to everybody else. Half the descriptors are left to workers, model files and
  // regions, so one peer can hold at most an eighth of them.
  if (c.max_connections_per_peer == 0) {
    const uint64_t connections = std::min<uint64_t>(c.max_connections, open_files / 2);
    c.max_connections_per_peer = static_cast<uint32_t>(std::max<uint64_t>(1, connections / 4));
  }
  if (c.max_requests_per_peer == 0) {
    const uint64_t requests = uint64_t{c.max_queue} + c.max_inflight;
    c.max_requests_per_peer = static_cast<uint32_t>(std::clamp<uint64_t>(requests / 4, 1, UINT32_MAX));
  }
  if (c.max_queued_bytes_per_peer == 0) c.max_queued_bytes_per_peer = c.max_queued_bytes / 4;
  if (c.max_unread_reply_bytes_per_peer == 0) c.max_unread_reply_bytes_per_peer = c.max_queued_bytes / 4;
  // A request as large as a frame may always be held, and its reply be unread.
  c.max_queued_bytes_per_peer = std::max(c.max_queued_bytes_per_peer, frame);
  c.max_unread_reply_bytes_per_peer = std::max(c.max_unread_reply_bytes_per_peer, frame + (64u << 10));
}

uint32_t ThreadsPerWorker(uint32_t configured, size_t workers) {
  if (configured != 0) return configured;
  cpu_set_t set;
  CPU_ZERO(&set);
  const int cpus = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
  return static_cast<uint32_t>(std::max<size_t>(1, static_cast<size_t>(cpus) / std::max<size_t>(1, workers)));
}

}  // namespace warmpool::supervisor
