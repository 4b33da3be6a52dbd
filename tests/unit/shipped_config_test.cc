// The configuration installed as /etc/warmpool/warmpool.toml (generated from
// systemd/warmpool.toml.in) and the units it goes with: the file parses, its commented
// "#key = value" lines are the real defaults, every key is documented, and it agrees with
// warmpool.service and warmpool.socket on the paths and the stop bound.
#include <cstdint>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "supervisor/config.h"

#ifndef WARMPOOL_SHIPPED_CONFIG
#error "WARMPOOL_SHIPPED_CONFIG must name the generated warmpool.toml"
#endif

namespace warmpool::supervisor {
namespace {

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// "#key = value": a key shown at its default. Prose comments start with "# ".
const std::regex kCommentedKey(R"(^#([a-z_]+) = .*)");
const std::regex kActiveKey(R"(^([a-z_]+) = .*)");
const std::regex kSection(R"(^\[([a-z_]+)\]\s*$)");

// The value of Key= in a unit file (the last one wins, as in systemd).
std::string UnitValue(const std::string& path, const std::string& key) {
  std::string value;
  for (const std::string& line : Lines(ReadAll(path))) {
    if (line.rfind(key + "=", 0) == 0) value = line.substr(key.size() + 1);
  }
  return value;
}

// "30s", "2min", "90": seconds.
int64_t UnitSeconds(const std::string& value) {
  std::smatch m;
  static const std::regex kTime(R"(^(\d+)(s|min)?$)");
  if (!std::regex_match(value, m, kTime)) {
    ADD_FAILURE() << "cannot read the time span \"" << value << "\"";
    return 0;
  }
  int64_t n = std::stoll(m[1].str());
  return m[2].str() == "min" ? n * 60 : n;
}

TEST(ShippedConfigTest, LoadsAndSetsTheSystemPaths) {
  Config c;
  Status s = LoadConfigFile(c, WARMPOOL_SHIPPED_CONFIG);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(CheckInstanceName(c.instance).ok());
  EXPECT_EQ(c.socket_path, "/run/warmpool/warmpool.sock");
  EXPECT_EQ(c.models_dir, "/var/lib/warmpool/models");
  EXPECT_EQ(c.engine_dir, WARMPOOL_SHIPPED_ENGINE_DIR);
  EXPECT_EQ(c.model_roots, std::vector<std::string>{"/var/lib/warmpool/models"});
  // The groups that sysusers.d/warmpool.conf creates.
  EXPECT_EQ(c.admin_group, "warmpool-admin");
  EXPECT_EQ(c.socket_group, "warmpool");
  EXPECT_EQ(c.observer_group, "warmpool");
  EXPECT_TRUE(c.models.empty());
  EXPECT_FALSE(c.enable_fault_injection);
}

// Uncommenting every "#key = value" line must change nothing: the file documents real defaults.
TEST(ShippedConfigTest, CommentedValuesAreTheDefaults) {
  std::string text = ReadAll(WARMPOOL_SHIPPED_CONFIG);
  std::string uncommented;
  int keys = 0;
  for (const std::string& line : Lines(text)) {
    if (std::regex_match(line, kCommentedKey)) {
      uncommented += line.substr(1) + "\n";
      ++keys;
    } else {
      uncommented += line + "\n";
    }
  }
  EXPECT_GT(keys, 20);
  Config shipped, spelled_out;
  ASSERT_TRUE(LoadConfigFile(shipped, WARMPOOL_SHIPPED_CONFIG).ok());
  Status s = ApplyToml(spelled_out, uncommented, WARMPOOL_SHIPPED_CONFIG);
  ASSERT_TRUE(s.ok()) << s.ToString() << "\n" << uncommented;
  const Config& a = shipped;
  const Config& b = spelled_out;
  EXPECT_EQ(a.socket_path, b.socket_path);
  EXPECT_EQ(a.models_dir, b.models_dir);
  EXPECT_EQ(a.backend, b.backend);
  EXPECT_EQ(a.instance, b.instance);
  EXPECT_EQ(a.workers_per_device, b.workers_per_device);
  EXPECT_EQ(a.default_deadline_ms, b.default_deadline_ms);
  EXPECT_EQ(a.engine_dir, b.engine_dir);
  EXPECT_EQ(a.drain_timeout_ms, b.drain_timeout_ms);
  EXPECT_EQ(a.stop_kill_ms, b.stop_kill_ms);
  EXPECT_EQ(a.capacity, b.capacity);
  EXPECT_EQ(a.budget_bytes, b.budget_bytes);
  EXPECT_EQ(a.max_queue, b.max_queue);
  EXPECT_EQ(a.keep_alive_ms, b.keep_alive_ms);
  EXPECT_EQ(a.park_budget_bytes, b.park_budget_bytes);
  EXPECT_EQ(a.single_active, b.single_active);
  EXPECT_EQ(a.max_cached, b.max_cached);
  EXPECT_EQ(a.preload, b.preload);
  EXPECT_EQ(a.max_frame_bytes, b.max_frame_bytes);
  EXPECT_EQ(a.max_connections, b.max_connections);
  EXPECT_EQ(a.max_models, b.max_models);
  EXPECT_EQ(a.max_inflight, b.max_inflight);
  EXPECT_EQ(a.max_requests_per_connection, b.max_requests_per_connection);
  EXPECT_EQ(a.max_queued_bytes, b.max_queued_bytes);
  EXPECT_EQ(a.max_queued_bytes_per_connection, b.max_queued_bytes_per_connection);
  EXPECT_EQ(a.max_unread_reply_bytes, b.max_unread_reply_bytes);
  EXPECT_EQ(a.idle_timeout_ms, b.idle_timeout_ms);
  EXPECT_EQ(a.admin_group, b.admin_group);
  EXPECT_EQ(a.socket_group, b.socket_group);
  EXPECT_EQ(a.observer_group, b.observer_group);
  EXPECT_EQ(a.model_roots, b.model_roots);
  EXPECT_EQ(a.inference_grace_ms, b.inference_grace_ms);
  EXPECT_EQ(a.load_stall_ms, b.load_stall_ms);
  EXPECT_EQ(a.crash_loop_crashes, b.crash_loop_crashes);
  EXPECT_EQ(a.crash_loop_window_ms, b.crash_loop_window_ms);
  EXPECT_EQ(a.failed_cooldown_ms, b.failed_cooldown_ms);
  EXPECT_EQ(a.failed_cooldown_max_ms, b.failed_cooldown_max_ms);
  EXPECT_EQ(a.respawn_min_ms, b.respawn_min_ms);
  EXPECT_EQ(a.respawn_max_ms, b.respawn_max_ms);
  EXPECT_EQ(a.respawn_stable_ms, b.respawn_stable_ms);
  EXPECT_EQ(a.models.size(), b.models.size());
}

// Every key the daemon reads appears, set or commented, in its own section; every [[models]] key
// appears in the commented example.
TEST(ShippedConfigTest, EveryKeyIsDocumented) {
  const std::map<std::string, std::set<std::string>> expected = {
      {"daemon", {"socket", "models_dir", "backend", "instance", "workers_per_device", "threads_per_worker",
                  "default_deadline_ms", "engine_dir", "drain_timeout_ms", "stop_kill_ms"}},
      {"pool", {"capacity", "budget", "max_queue", "keep_alive", "preload", "park_budget",
                "max_cached", "single_active", "max_batch_delay_us"}},
      {"limits", {"max_frame_bytes", "max_connections", "max_models", "max_inflight",
                  "max_requests_per_connection", "max_queued_bytes",
                  "max_queued_bytes_per_connection", "max_unread_reply_bytes", "idle_timeout",
                  "max_connections_per_peer", "max_requests_per_peer", "max_queued_bytes_per_peer",
                  "max_unread_reply_bytes_per_peer", "reserved_connections", "request_read_timeout"}},
      {"access", {"admin_group", "socket_group", "observer_group", "model_roots"}},
      {"recovery", {"inference_grace_ms", "load_stall_ms", "crash_loop_crashes",
                    "crash_loop_window_ms", "failed_cooldown_ms", "failed_cooldown_max_ms",
                    "respawn_min_ms", "respawn_max_ms", "respawn_stable_ms"}},
  };
  std::map<std::string, std::set<std::string>> found;
  std::set<std::string> model_keys;
  std::string section;
  bool in_models_example = false;
  const std::regex example_key(R"(^# ([a-z_]+) = .*)");
  for (const std::string& line : Lines(ReadAll(WARMPOOL_SHIPPED_CONFIG))) {
    std::smatch m;
    if (std::regex_match(line, m, kSection)) {
      section = m[1].str();
    } else if (std::regex_match(line, m, kCommentedKey) || std::regex_match(line, m, kActiveKey)) {
      found[section].insert(m[1].str());
    } else if (line.rfind("# [[models]]", 0) == 0) {
      in_models_example = true;
    } else if (in_models_example && std::regex_match(line, m, example_key)) {
      model_keys.insert(m[1].str());
    }
  }
  for (const auto& [name, keys] : expected) {
    for (const std::string& key : keys) {
      EXPECT_TRUE(found[name].count(key)) << "[" << name << "] " << key << " is not documented";
    }
    for (const std::string& key : found[name]) {
      EXPECT_TRUE(keys.count(key)) << "[" << name << "] " << key << " is not a known key";
    }
  }
  EXPECT_EQ(model_keys,
            (std::set<std::string>{"name", "engine", "path", "keep_alive", "replicas", "max_batch_delay_us"}));
}

// The units start the daemon on this file, hand it the socket it names, and wait longer for a stop
// than the daemon's own drain-then-kill bound.
TEST(ShippedConfigTest, AgreesWithTheUnits) {
  Config c;
  ASSERT_TRUE(LoadConfigFile(c, WARMPOOL_SHIPPED_CONFIG).ok());
  EXPECT_EQ(UnitValue(WARMPOOL_SHIPPED_SOCKET_UNIT, "ListenStream"), c.socket_path);
  EXPECT_EQ(UnitValue(WARMPOOL_SHIPPED_SOCKET_UNIT, "SocketMode"), "0660");
  EXPECT_EQ(UnitValue(WARMPOOL_SHIPPED_SOCKET_UNIT, "SocketGroup"), c.socket_group);
  std::string exec_start = UnitValue(WARMPOOL_SHIPPED_SERVICE_UNIT, "ExecStart");
  EXPECT_NE(exec_start.find("/warmpoold --config " WARMPOOL_SHIPPED_CONFIG_INSTALLED),
            std::string::npos)
      << exec_start;
  EXPECT_EQ(UnitValue(WARMPOOL_SHIPPED_SERVICE_UNIT, "KillMode"), "mixed");
  int64_t stop_s = UnitSeconds(UnitValue(WARMPOOL_SHIPPED_SERVICE_UNIT, "TimeoutStopSec"));
  int64_t drain_ms = int64_t{c.drain_timeout_ms} + c.stop_kill_ms;
  // Margin for the workers' own exit and the segment's removal after the last KILL.
  EXPECT_GE(stop_s * 1000, drain_ms + 5000)
      << "TimeoutStopSec= must exceed drain_timeout_ms + stop_kill_ms";
}

}  // namespace
}  // namespace warmpool::supervisor
