// The world a seed draws: the model files (one a language model), the devices and their budgets,
// the configuration's settings, the workers, the clients, and how often the environment misbehaves.
#include <algorithm>

#include <fmt/format.h>

#include "sim/simulator.h"

namespace warmpool::sim {

supervisor::Config Simulator::MakeConfig() const {
  supervisor::Config c;
  c.socket_path = "/sim/warmpool.sock";
  c.models_dir = "";
  c.instance = "sim";
  c.max_models = 16;
  c.max_inflight = 64;
  c.max_frame_bytes = 1u << 20;
  c.max_queue = 64;
  c.max_requests_per_connection = 32;
  c.default_deadline_ms = 2000;
  c.inference_grace_ms = 100;
  c.load_stall_ms = 400;
  c.crash_loop_crashes = 3;
  c.crash_loop_window_ms = 2000;
  c.failed_cooldown_ms = 200;
  c.failed_cooldown_max_ms = 1600;
  c.respawn_min_ms = 20;
  c.respawn_max_ms = 400;
  c.respawn_stable_ms = 3000;
  c.drain_timeout_ms = 1000;
  c.stop_kill_ms = 300;
  c.enable_fault_injection = false;
  c.max_queued_bytes = 2u << 20;
  c.max_queued_bytes_per_connection = 1u << 20;
  return c;
}

void Simulator::MakeWorld() {
  config_ = MakeConfig();
  config_.workers_per_device = static_cast<uint32_t>(rng_.Range(2, 3));
  uint64_t largest = 0;
  for (uint32_t i = 0; i < 5; i++) {
    SimFile f;
    f.id = i;
    f.name = fmt::format("m{}", i);
    f.path = fmt::format("/sim/models/m{}.safetensors", i);
    f.base_bytes = rng_.Range(16, 64) * 4096;
    f.workspace_bytes = rng_.Range(1, 8) * 4096;
    f.language = i == 2;  // generations stream from it (sim/generate.cc)
    largest = std::max(largest, f.base_bytes + 3 * 4096 + 2 * f.workspace_bytes);
    files_.push_back(f);
  }
  largest_model_ = largest;
  SimFile echo;
  echo.id = 5;
  echo.name = "echo";
  echo.echo = true;
  files_.push_back(echo);
  for (uint32_t i = 0; i < 2; i++) {  // registered by clients, never configured
    SimFile f;
    f.id = 6 + i;
    f.name = fmt::format("c{}", i);
    f.path = fmt::format("/sim/models/c{}.safetensors", i);
    f.base_bytes = rng_.Range(16, 48) * 4096;
    f.workspace_bytes = rng_.Range(1, 4) * 4096;
    files_.push_back(f);
  }
  configured_.assign(files_.size(), false);
  for (uint32_t i = 0; i <= 5; i++) configured_[i] = true;

  // One to three devices, each with room for two to four of the models at once (and a budget
  // of its own).
  const uint32_t devices = rng_.Chance(400) ? 1 : static_cast<uint32_t>(rng_.Range(2, 3));
  for (uint32_t d = 0; d < devices; d++) {
    config_.devices.push_back(supervisor::DeviceConfig{fmt::format("sim{}", d), 0, largest * rng_.Range(2, 4)});
  }
  config_.budget_bytes = config_.devices.front().budget_bytes;
  config_.park_budget_bytes = rng_.Chance(500) ? 0 : largest * rng_.Range(1, 3);
  if (rng_.Chance(100)) config_.single_active = true;
  if (rng_.Chance(200)) config_.max_cached = static_cast<uint32_t>(rng_.Range(2, 4));
  if (rng_.Chance(200)) config_.capacity = static_cast<uint32_t>(rng_.Range(1, 3));
  config_.keep_alive_ms = rng_.Chance(500) ? -1 : static_cast<int64_t>(rng_.Range(100, 2000));
  for (const SimFile& f : files_) {
    if (!configured_[f.id]) continue;
    supervisor::ModelConfig m;
    m.name = f.name;
    m.engine = f.echo ? "echo" : "dense";
    m.path = f.path;
    m.replicas = rng_.Chance(150) ? 2 : 1;
    config_.models.push_back(m);
  }
  models_in_use_ = static_cast<uint32_t>(rng_.Chance(300) ? rng_.Range(1, 2) : 5);
  calm_ = rng_.Chance(250);
  if (rng_.Chance(300)) {
    config_.preload = {files_[rng_.Below(models_in_use_)].name, files_[rng_.Below(models_in_use_)].name};
  }
  crash_per_mille_ = static_cast<uint32_t>(rng_.Range(0, 20));
  hang_per_mille_ = static_cast<uint32_t>(rng_.Range(0, 5));
  slow_per_mille_ = static_cast<uint32_t>(rng_.Range(0, 40));
  congestion_per_mille_ = static_cast<uint32_t>(rng_.Range(0, 200));
  if (calm_) crash_per_mille_ = hang_per_mille_ = 0;

  workers_.resize(config_.workers_per_device * devices);
  devices_gone_.assign(devices, false);
  devices_down_.assign(devices, false);
  device_epochs_.assign(devices, 0);
  for (uint32_t i = 0; i < workers_.size(); i++) {
    workers_[i].slot = i;
    workers_[i].device = i / config_.workers_per_device;
  }
  clients_.resize(rng_.Range(2, 6));
  for (uint32_t i = 0; i < clients_.size(); i++) {
    clients_[i].index = i;
    clients_[i].admin = i != 0 || rng_.Chance(500);  // client 0 is often a plain user
  }
  if (rng_.Chance(200)) clients_.back().greedy = true;
  std::vector<uint64_t> budgets;
  for (const supervisor::DeviceConfig& d : config_.devices) budgets.push_back(d.budget_bytes);
  Trace(fmt::format("world: seed {} devices {} workers {} clients {} budget {} park {} single_active {} "
                    "max_cached {} capacity {} keep_alive {} chaos crash {} hang {} slow {} "
                    "congestion {} models in use {} greedy client {} calm {}",
                    options_.seed, devices, workers_.size(), clients_.size(), fmt::join(budgets, "/"),
                    config_.park_budget_bytes, config_.single_active, config_.max_cached,
                    config_.capacity, config_.keep_alive_ms, crash_per_mille_, hang_per_mille_,
                    slow_per_mille_, congestion_per_mille_, models_in_use_, clients_.back().greedy, calm_));
}

}  // namespace warmpool::sim
