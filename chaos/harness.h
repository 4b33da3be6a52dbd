// The fault-injection harness's view of one daemon: it starts one (fresh temporary directory) or
// attaches to a live one, knows its models and their expected outputs, arms faults, waits for
// quiescence, and checks the design's invariants — reading the segment read-only where it must.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "chaos/fd_census.h"
#include "client/client.h"
#include "common/status.h"
#include "devmem/host_memory.h"
#include "engines/builtin.h"
#include "launch/daemon_process.h"
#include "launch/service_manager_double.h"

namespace warmpool::chaos {

inline void Sleep(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

struct Options {
  std::string socket;       // live daemon; empty: start our own
  std::string instance;     // live daemon's instance (for the segment)
  std::string daemon_path;  // warmpoold to start
  std::string victim;       // live mode: models to use (own daemon: made by the harness)
  std::string bystander;
  std::string backend;      // own daemon: warmpoold --backend (empty: its default, auto)
  bool verbose = false;
};

struct ModelUnderTest {
  std::string name;
  std::string path;   // empty for echo
  uint32_t in_features = 0;
  uint32_t out_features = 0;
};

// One line per invariant checked, for the report.
struct Checks {
  std::vector<std::string> passed;
  std::vector<std::string> failed;
  void Expect(bool ok, const std::string& what, const std::string& detail = "");
  bool ok() const { return failed.empty(); }
};

class Traffic;

class Harness {
 public:
  explicit Harness(Options options) : options_(std::move(options)) {}
  // The last lines of its own daemon's log that name `text` (a failure's context; empty against a
  // live daemon).
  std::string DaemonLogAbout(const std::string& text, size_t lines = 30) const;
  ~Harness();

  Status Start();
  // Own daemon: SIGTERM, then invariant 6 (exit 0, no segment, no socket, no orphan workers).
  void Stop(Checks* checks);
  bool owns_daemon() const { return options_.socket.empty(); }

  Result<std::unique_ptr<client::Client>> Connect() const;
  // A model for faults to hit. With an own daemon each scenario gets a fresh one, so that crash
  // counts of one scenario do not push the next into a crash loop; a live daemon has one.
  const ModelUnderTest& victim(size_t index) const {
    return victims_.empty() ? victim_ : victims_[index % victims_.size()];
  }
  const ModelUnderTest& bystander() const { return bystander_; }
  const std::vector<ModelUnderTest>& fillers() const { return fillers_; }
  const std::vector<std::string>& broken() const { return broken_; }
  const Options& options() const { return options_; }
  const std::string& socket() const { return socket_; }

  // The output the model must give for input (computed here with the same engine code).
  client::Matrix Expected(const ModelUnderTest& model, const client::Matrix& input);

  Status ArmFault(const std::string& point, const std::string& action, const std::string& model,
                  uint32_t after = 0, uint32_t times = 1);
  Status ClearFaults();
  Status Load(const std::string& model);
  Status Unload(const std::string& model);

  // Waits until nothing is in flight, queued, loading or unloading and every worker runs.
  Status Quiesce(int timeout_ms = 15000);
  // Invariants 2-4 and 6 at quiescence: segment valid, in-flight table empty, byte accounting,
  // LRU, budget, no fd leaked by the daemon since Baseline(), no orphan worker. The baseline is a
  // settled census (chaos/fd_census.h) taken with no Traffic running: their connections would be
  // counted, and gone by the check.
  Status Baseline();
  void CheckQuiescent(Checks& checks);
  // Worker restarts summed over the pool.
  uint32_t TotalRestarts();
  std::string SegmentDump();

  // Keeps the temporary directory (daemon log, models) for a post-mortem.
  void KeepDirectory() { keep_dir_ = true; }
  const std::string& directory() const { return dir_; }

  // Own daemon only: SIGKILL the supervisor and check its workers die with it; then start it again.
  // Between the two, a scenario stops and joins its traffic against the killed daemon: a client
  // thread slow to start would otherwise connect to the new one. warm: under the stand-in for
  // systemd's descriptor store (launch/service_manager_double.h), which keeps what the killed one
  // stored; otherwise the store is emptied first, as `systemctl stop` does, and every model loads
  // again.
  void Kill(Checks& checks);
  void Restart(Checks& checks, bool warm = false);
  // Own daemon only: until the descriptor store is up to date and keeps the weights of each of
  // `ready` and the parked copy of each of `parked`; false after a few seconds.
  bool WaitUntilKept(const std::vector<std::string>& ready, const std::vector<std::string>& parked);
  // Loads from a model file the daemon counted for this model (the segment's stats); -1 when the
  // segment or the model cannot be found.
  int64_t FileLoads(const std::string& model);
  // From the segment's header; -1 when there is no segment.
  pid_t SupervisorPid();
  // The backend serving ("host" or "cuda"), as the daemon's status says.
  std::string Backend();
  // cuda: the supervisor's child that owns a device's memory (warmpool-owner; -1 when none runs),
  // and how many devices serve.
  pid_t OwnerPid(uint32_t device = 0);
  uint32_t DeviceCount();

 private:
  friend class Traffic;  // counts itself in open_traffic_
  Status StartOwnDaemon();
  Status MakeModels();
  Status Launch();
  Status DescribeLiveModels();
  void RememberWorkers();
  // Models whose regions the supervisor should hold: ready with weights, and parked.
  // (lm_caches: the replicas of ready transformer models, each holding a KV cache region, and the
  // parked ones that kept theirs.)
  void HeldRegions(int* ready, int* parked, int* lm_caches);

  Options options_;
  std::string dir_;
  std::string socket_;
  std::string instance_;
  std::unique_ptr<launch::DaemonProcess> daemon_;  // own daemon only
  std::unique_ptr<launch::ServiceManagerDouble> service_manager_;  // own daemon only
  ModelUnderTest victim_, bystander_;
  std::vector<ModelUnderTest> victims_;
  std::vector<ModelUnderTest> fillers_;
  std::vector<std::string> broken_;
  std::set<pid_t> workers_seen_;
  std::optional<FdCensus> baseline_;  // unset: not readable (another user's daemon), not checked
  std::string baseline_children_;
  std::atomic<int> open_traffic_{0};  // Traffic generators started and not yet joined
  bool keep_dir_ = false;

  std::mutex engines_mutex_;
  HostMemory memory_;
  std::map<std::string, std::unique_ptr<Engine>> engines_;
};

}  // namespace warmpool::chaos
