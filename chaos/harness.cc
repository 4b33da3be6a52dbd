#include "chaos/harness.h"
#include "engines/catalog/builtin_engines.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <deque>
#include <filesystem>
#include <fstream>
#include <string_view>
#include <thread>

#include "common/units.h"
#include "shm/segment.h"
#include "shm/stats.h"

namespace warmpool::chaos {

namespace fs = std::filesystem;

void Checks::Expect(bool ok, const std::string& what, const std::string& detail) {
  if (ok) passed.push_back(what);
  else failed.push_back(detail.empty() ? what : what + ": " + detail);
}

Harness::~Harness() {
  daemon_.reset();  // a daemon still running is killed
  if (!dir_.empty() && !keep_dir_) {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
}

Status Harness::Start() {
  if (owns_daemon()) {
    if (Status s = StartOwnDaemon(); !s.ok()) return s;
  } else {
    socket_ = options_.socket;
    instance_ = options_.instance;
    if (Status s = DescribeLiveModels(); !s.ok()) return s;
  }
  {
    auto client = Connect();
    if (!client.ok()) return client.status();
    auto status = (*client)->GetStatus();
    if (!status.ok()) return status.status();
    if (!status->fault_injection()) {
      return Error(Code::kFailedPrecondition,
                   "the daemon at {} does not accept faults: start it with "
                   "--enable-fault-injection",
                   socket_);
    }
  }
  if (Status s = Quiesce(); !s.ok()) return s;
  return Baseline();
}

Status Harness::StartOwnDaemon() {
  char tmpl[] = "/tmp/warmpool-chaos-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return Error(Code::kInternal, "mkdtemp: {}", std::strerror(errno));
  dir_ = tmpl;
  socket_ = dir_ + "/warmpool.sock";
  instance_ = "chaos-" + std::to_string(getpid());
  if (Status s = MakeModels(); !s.ok()) return s;
  Result<std::unique_ptr<launch::ServiceManagerDouble>> manager = launch::ServiceManagerDouble::Open(dir_ + "/notify");
  if (!manager.ok()) return manager.status();
  service_manager_ = std::move(*manager);
  return Launch();
}

std::string Harness::DaemonLogAbout(const std::string& text, size_t lines) const {
  if (!owns_daemon()) return {};
  std::ifstream log(dir_ + "/daemon.log");
  std::deque<std::string> last;
  for (std::string line; std::getline(log, line);) {
    if (line.find(text) == std::string::npos && line.find("worker") == std::string::npos) continue;
    last.push_back(std::move(line));
    if (last.size() > lines) last.pop_front();
  }
  std::string out;
  for (const std::string& line : last) out += "          " + line + "\n";
  return out;
}

Status Harness::Launch() {
  launch::DaemonSpec spec;
  spec.binary = options_.daemon_path;
  spec.directory = dir_;
  spec.socket = socket_;
  spec.instance = instance_;
  spec.config = dir_ + "/config.toml";
  spec.models_dir = dir_ + "/models";
  spec.args = {"--enable-fault-injection"};
  if (!options_.backend.empty()) spec.args.insert(spec.args.end(), {"--backend", options_.backend});
  if (service_manager_ != nullptr) service_manager_->PrepareStart(spec);
  daemon_ = std::make_unique<launch::DaemonProcess>(spec);
  if (Status s = daemon_->Start(); !s.ok()) return s;
  return daemon_->WaitReady(10000);
}

Status Harness::DescribeLiveModels() {
  auto client = Connect();
  if (!client.ok()) return client.status();
  auto models = (*client)->Models();
  if (!models.ok()) return models.status();
  auto find = [&](const std::string& name, ModelUnderTest& out) -> Status {
    for (const auto& m : models->models()) {
      if (m.name() != name) continue;
      if (m.engine() != "dense" && m.engine() != "echo") break;
      out = ModelUnderTest{m.name(), m.engine() == "echo" ? "" : m.path(), m.in_features(),
                           m.out_features()};
      if (out.in_features == 0) out.in_features = 16;
      return OkStatus();
    }
    return Error(Code::kNotFound,
                 "model \"{}\" is not a registered dense or echo model of the daemon (pass "
                 "--victim and --bystander)",
                 name);
  };
  if (Status s = find(options_.victim, victim_); !s.ok()) return s;
  return find(options_.bystander, bystander_);
}

Result<std::unique_ptr<client::Client>> Harness::Connect() const {
  return client::Client::Connect(socket_);
}

client::Matrix Harness::Expected(const ModelUnderTest& model, const client::Matrix& input) {
  if (model.path.empty()) return input;  // echo
  std::lock_guard lock(engines_mutex_);
  auto it = engines_.find(model.path);
  if (it == engines_.end()) {
    wp_engine_spec spec = SpecForFile(model.name.c_str(), model.path.c_str(), nullptr, 0, 0);
    auto engine = Engine::Open(FindBuiltinEngine("dense"), spec, memory_.service());
    if (!engine.ok() || !engine->Load().ok()) return {};
    it = engines_.emplace(model.path, std::make_unique<Engine>(std::move(*engine))).first;
  }
  client::Matrix out;
  if (!it->second->Infer(input.data, input.rows, input.cols, out.data).ok()) return {};
  out.rows = input.rows;
  out.cols = it->second->OutputColumns(input.cols);
  return out;
}

Status Harness::ArmFault(const std::string& point, const std::string& action,
                         const std::string& model, uint32_t after, uint32_t times) {
  auto client = Connect();
  if (!client.ok()) return client.status();
  return (*client)->ArmFault(client::FaultSpec{point, action, model, after, times}).status();
}

Status Harness::ClearFaults() {
  auto client = Connect();
  if (!client.ok()) return client.status();
  return (*client)->ClearFaults().status();
}

Status Harness::Load(const std::string& model) {
  auto client = Connect();
  if (!client.ok()) return client.status();
  return (*client)->Load(model).status();
}

Status Harness::Unload(const std::string& model) {
  auto client = Connect();
  if (!client.ok()) return client.status();
  Status s = (*client)->Unload(model);
  if (s.code() == Code::kFailedPrecondition) return OkStatus();  // not loaded: fine
  return s;
}

void Harness::RememberWorkers() {
  auto client = Connect();
  if (!client.ok()) return;
  auto status = (*client)->GetStatus();
  if (!status.ok()) return;
  for (const auto& w : status->workers()) {
    if (w.pid() > 0) workers_seen_.insert(w.pid());
  }
}

Status Harness::Quiesce(int timeout_ms) {
  auto client = Connect();
  if (!client.ok()) return client.status();
  std::string last;
  for (int waited = 0; waited < timeout_ms; waited += 20) {
    auto status = (*client)->GetStatus();
    auto ps = (*client)->Ps();
    if (!status.ok() || !ps.ok()) return status.ok() ? ps.status() : status.status();
    for (const auto& w : status->workers()) {
      if (w.pid() > 0) workers_seen_.insert(w.pid());
    }
    bool busy = status->inflight() != 0 || status->queued() != 0;
    for (const auto& m : ps->models()) {
      busy = busy || m.state() == "loading" || m.state() == "unloading" || m.inflight() != 0;
    }
    for (const auto& w : status->workers()) {
      busy = busy || w.state() == "starting" || w.state() == "dead" || w.state() == "busy";
    }
    if (!busy) return OkStatus();
    last = status->ShortDebugString();
    Sleep(20);
  }
  return Error(Code::kDeadlineExceeded, "the daemon did not become quiescent in {} ms: {}",
               timeout_ms, last);
}

int64_t Harness::FileLoads(const std::string& model) {
  auto segment = shm::SharedSegment::Open(instance_, /*read_only=*/true);
  if (!segment.ok()) return -1;
  const shm::SegmentView& v = segment->view();
  for (uint32_t i = 0; i < v.header().max_models; i++) {
    if (v.model(i).state != 0 && model == v.model(i).name) {
      return static_cast<int64_t>(shm::StatLoad(v.model_stats(i).loads[static_cast<uint32_t>(shm::LoadSource::kFile)]));
    }
  }
  return -1;
}

pid_t Harness::SupervisorPid() {
  auto segment = shm::SharedSegment::Open(instance_, /*read_only=*/true);
  if (!segment.ok()) return -1;
  return static_cast<pid_t>(segment->view().header().supervisor_pid);
}

std::string Harness::Backend() {
  auto client = Connect();
  if (!client.ok()) return "";
  auto status = (*client)->GetStatus();
  return status.ok() ? status->backend() : "";
}

pid_t Harness::OwnerPid(uint32_t device) {
  return launch::ChildNamed(SupervisorPid(), "warmpool-owner", {"--device", std::to_string(device)});
}

uint32_t Harness::DeviceCount() {
  auto client = Connect();
  if (!client.ok()) return 1;
  auto status = (*client)->GetStatus();
  return status.ok() && status->devices_size() > 0 ? static_cast<uint32_t>(status->devices_size()) : 1;
}

void Harness::Kill(Checks& checks) {
  RememberWorkers();
  std::set<pid_t> workers = workers_seen_;
  daemon_->Kill();
  // SIGKILL by PR_SET_PDEATHSIG is immediate, but the exit itself (unmapping the weights, a
  // sanitizer's shadow memory) waits for a CPU that a loaded machine may not give for seconds: the
  // promise is that they exit, not how fast, so the bound is generous and the loop ends early.
  bool gone = false;
  for (int i = 0; i < 2000 && !gone; i++) {
    gone = true;
    for (pid_t pid : workers) gone = gone && kill(pid, 0) != 0;
    if (!gone) Sleep(10);
  }
  checks.Expect(gone, "workers exit with their supervisor (no orphans)");
  checks.Expect(fs::exists("/dev/shm/warmpool." + instance_),
                "stale segment left by the killed supervisor (to be cleaned at restart)");
}

void Harness::Restart(Checks& checks, bool warm) {
  if (!warm && service_manager_ != nullptr) service_manager_->Clear();
  Status started = Launch();
  checks.Expect(started.ok(), "restart on the same instance and socket", started.message());
  if (!started.ok()) return;
  Status quiet = Quiesce();
  checks.Expect(quiet.ok(), "restarted daemon quiescent", quiet.message());
  Status baseline = Baseline();
  checks.Expect(baseline.ok(), "fd baseline of the restarted daemon", baseline.message());
}

bool Harness::WaitUntilKept(const std::vector<std::string>& ready, const std::vector<std::string>& parked) {
  if (service_manager_ == nullptr) return false;
  auto holds = [](const v1::KeptManifest& m, const std::string& name, bool is_parked) {
    for (const v1::KeptModel& k : m.models()) {
      if (k.name() == name && k.parked() == is_parked) return true;
    }
    return false;
  };
  return service_manager_->WaitForKept(
      [&](const v1::KeptManifest& m) {
        for (const std::string& name : ready) {
          if (!holds(m, name, false)) return false;
        }
        for (const std::string& name : parked) {
          if (!holds(m, name, true)) return false;
        }
        return true;
      },
      std::chrono::seconds(5));
}

void Harness::Stop(Checks* checks) {
  if (!daemon_ || !daemon_->running()) return;
  RememberWorkers();
  int exit = daemon_->Stop();
  if (checks == nullptr) return;
  checks->Expect(exit == 0, "daemon stopped cleanly (it validates the segment on exit)",
                 fmt::format("exit status {}; see {}/daemon.log", exit, dir_));
  checks->Expect(!fs::exists("/dev/shm/warmpool." + instance_), "segment removed at stop");
  checks->Expect(!fs::exists(socket_), "socket removed at stop");
  bool orphans = false;
  for (pid_t pid : workers_seen_) orphans = orphans || kill(pid, 0) == 0;
  checks->Expect(!orphans, "no worker outlives the daemon");
}

}  // namespace warmpool::chaos
