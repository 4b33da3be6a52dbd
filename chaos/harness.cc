#include "chaos/harness.h"
#include "engines/catalog/builtin_engines.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <deque>
#include <filesystem>
#include <fstream>
#include <random>
#include <string_view>
#include <thread>

#include "common/units.h"
#include "engines/dense_model.h"
#include "engines/safetensors.h"
#include "shm/inflight.h"
#include "shm/model_index.h"
#include "shm/segment.h"
#include "shm/stats.h"

namespace warmpool::chaos {

namespace fs = std::filesystem;

void Checks::Expect(bool ok, const std::string& what, const std::string& detail) {
  if (ok) passed.push_back(what);
  else failed.push_back(detail.empty() ? what : what + ": " + detail);
}

namespace {

// A dense model with random weights, as warmpool-mkmodel writes them.
Status WriteDense(const std::string& path, const std::vector<uint64_t>& layers, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<safetensors::TensorToWrite> tensors;
  for (size_t i = 0; i + 1 < layers.size(); i++) {
    uint64_t in = layers[i], out = layers[i + 1];
    float bound = 1.0f / std::sqrt(static_cast<float>(in));
    std::uniform_real_distribution<float> dist(-bound, bound);
    auto make = [&](const std::string& name, std::vector<uint64_t> shape, uint64_t n) {
      std::vector<uint8_t> data(n * 4);
      for (uint64_t k = 0; k < n; k++) {
        float v = dist(rng);
        std::memcpy(data.data() + k * 4, &v, 4);
      }
      tensors.push_back({name, safetensors::DType::F32, std::move(shape), std::move(data)});
    };
    make(std::to_string(2 * i) + ".weight", {out, in}, out * in);
    make(std::to_string(2 * i) + ".bias", {out}, out);
  }
  return safetensors::WriteFile(path, tensors, {{"activation", "relu"}, {"engine", "dense"}});
}

uint64_t AccountedBytes(const std::string& path) {
  auto header = safetensors::ReadHeader(path);
  if (!header.ok()) return 0;
  auto model = dense::DescribeModel(*header, path);
  if (!model.ok()) return 0;
  return header->data_bytes + dense::WorkspaceBytes(dense::ScratchFor(*model));
}

}  // namespace

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

Status Harness::MakeModels() {
  fs::create_directories(dir_ + "/models");
  auto dense = [&](const std::string& name, std::vector<uint64_t> layers, uint64_t seed,
                   ModelUnderTest* out) -> Status {
    std::string path = dir_ + "/models/" + name + ".safetensors";
    if (Status s = WriteDense(path, layers, seed); !s.ok()) return s;
    if (out != nullptr) {
      *out = ModelUnderTest{name, path, static_cast<uint32_t>(layers.front()),
                            static_cast<uint32_t>(layers.back())};
    }
    return OkStatus();
  };
  if (Status s = dense("victim", {32, 64, 8}, 1, &victim_); !s.ok()) return s;
  for (int i = 0; i < 48; i++) {
    ModelUnderTest m;
    if (Status s = dense(fmt::format("v{:02}", i), {32, 64, 8}, 100 + i, &m); !s.ok()) return s;
    victims_.push_back(m);
  }
  if (Status s = dense("bystander", {32, 48, 8}, 2, &bystander_); !s.ok()) return s;
  for (int i = 0; i < 4; i++) {
    ModelUnderTest m;
    if (Status s = dense("filler" + std::to_string(i), {64, 512, 64}, 10 + i, &m); !s.ok()) return s;
    fillers_.push_back(m);
  }
  // Malformed files of three kinds: noise, a header promising more data than the file has, and
  // layers that do not chain.
  {
    std::ofstream f(dir_ + "/models/noise.safetensors", std::ios::binary);
    std::mt19937 rng(7);
    for (int i = 0; i < 4096; i++) f.put(static_cast<char>(rng()));
  }
  if (Status s = dense("truncated", {32, 64, 8}, 3, nullptr); !s.ok()) return s;
  fs::resize_file(dir_ + "/models/truncated.safetensors",
                  fs::file_size(dir_ + "/models/truncated.safetensors") - 100);
  {
    std::vector<safetensors::TensorToWrite> t = {
        {"0.weight", safetensors::DType::F32, {4, 8}, std::vector<uint8_t>(128)},
        {"2.weight", safetensors::DType::F32, {2, 5}, std::vector<uint8_t>(40)}};
    if (Status s = safetensors::WriteFile(dir_ + "/models/unchained.safetensors", t, {}); !s.ok()) {
      return s;
    }
  }
  broken_ = {"noise", "truncated", "unchained"};

  // The budget holds the victim, the bystander and two and a half fillers: the budget scenario
  // forces evictions, the others never need one.
  uint64_t budget = AccountedBytes(victim_.path) + AccountedBytes(bystander_.path) +
                    AccountedBytes(fillers_[0].path) * 5 / 2;
  std::ofstream config(dir_ + "/config.toml");
  config << "[daemon]\nworkers_per_device = 2\ndefault_deadline_ms = 4000\n"
         << "[pool]\nbudget = " << budget << "\npark_budget = \"64MiB\"\n"
         << "[recovery]\ninference_grace_ms = 300\nload_stall_ms = 1000\n"
         << "crash_loop_crashes = 3\ncrash_loop_window_ms = 20000\n"
         << "failed_cooldown_ms = 1000\nfailed_cooldown_max_ms = 4000\n"
         << "respawn_min_ms = 20\nrespawn_max_ms = 400\nrespawn_stable_ms = 5000\n"
         // cuda: device weights kept across a restart too (on a GPU the warm-restart scenario then
         // shows whether an allocation outlives its owner; the driver double's always does).
         << "[cuda]\nkeep_across_restarts = true\n"
         << "[[models]]\nname = \"echo\"\nengine = \"echo\"\n";
  return OkStatus();
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

void Harness::HeldRegions(int* ready, int* parked, int* lm_caches) {
  *ready = *parked = *lm_caches = -1;
  auto segment = shm::SharedSegment::Open(instance_, /*read_only=*/true);
  if (!segment.ok()) return;
  *ready = *parked = *lm_caches = 0;
  for (uint32_t i = 0; i < segment->view().max_models(); i++) {
    const shm::ModelRecord& m = segment->view().model(i);
    auto state = static_cast<shm::ModelState>(m.state);
    *ready += state == shm::ModelState::kReady && m.weight_bytes > 0;
    *parked += state == shm::ModelState::kParked && m.weight_bytes > 0;
    if (std::string_view(m.engine) != "transformer") continue;
    if (state == shm::ModelState::kReady) *lm_caches += m.replicas;
    // A parked language model's KV cache is kept with its copy: its record's workspace.
    if (state == shm::ModelState::kParked && m.workspace_bytes > 0) *lm_caches += 1;
  }
}

Status Harness::Baseline() {
  // A scenario's own clients would be counted too, and be gone by the check: the baseline is
  // taken with the harness's one connection open and nothing else of the harness connected.
  if (int open = open_traffic_.load(); open != 0) {
    return Error(Code::kInternal, "{} traffic generator(s) still running at the fd baseline: join them first", open);
  }
  baseline_.reset();
  const pid_t supervisor = SupervisorPid();
  if (!FdCensus::Take(supervisor)) return OkStatus();  // not ours to read (a live daemon): not checked
  auto client = Connect();
  if (client.ok()) (void)(*client)->GetStatus();
  baseline_ = FdCensus::Settled(supervisor);
  if (!baseline_) {
    return Error(Code::kUnavailable, "the supervisor's descriptors did not hold still for a baseline");
  }
  baseline_children_ = ChildrenOf(supervisor);
  return OkStatus();
}

void Harness::CheckQuiescent(Checks& checks) {
  Status quiet = Quiesce();
  checks.Expect(quiet.ok(), "quiescent", quiet.message());
  auto segment = shm::SharedSegment::Open(instance_, /*read_only=*/true);
  checks.Expect(segment.ok(), "segment readable", segment.status().message());
  if (!segment.ok()) return;
  shm::InflightTable inflight(segment->view());
  uint32_t taken = inflight.CountTaken();
  checks.Expect(taken == 0, "in-flight table empty", fmt::format("{} slots still taken", taken));
  Status valid = shm::Validate(segment->view());
  checks.Expect(valid.ok(), "index valid (LRU, accounting, budget, in-flight tags)",
                valid.message());
  auto client = Connect();
  if (client.ok()) {
    (void)(*client)->GetStatus();
    // Connections the harness just closed may not have been reaped by the daemon's loop yet.
    const pid_t supervisor = SupervisorPid();
    std::optional<FdCensus> census = FdCensus::Take(supervisor);
    for (int i = 0; i < 50 && census && baseline_ && census->count() != baseline_->count(); i++) {
      Sleep(10);
      (void)(*client)->GetStatus();
      census = FdCensus::Take(supervisor);
    }
    // Freed memory the daemon keeps for reuse is memfds too, and a reused one keeps the name it
    // was created with (a parked copy's may come to hold a ready model's weights): only the sum
    // can be checked.
    int kept = 0;
    if (auto status = (*client)->GetStatus(); status.ok() && status->devices_size() > 0) {
      const v1::DeviceStatus& device = status->devices(0);
      kept = static_cast<int>(device.kept_regions());
      checks.Expect(device.budget_bytes() == 0 || device.used_bytes() + device.kept_bytes() <= device.budget_bytes(),
                    "used and kept memory within the budget",
                    fmt::format("{} used + {} kept > {} budget", device.used_bytes(), device.kept_bytes(),
                                device.budget_bytes()));
    }
    if (census && baseline_) {
      std::string children = ChildrenOf(supervisor);
      checks.Expect(census->count() == baseline_->count(), "no fd leaked by the supervisor",
                    fmt::format("{} open besides weights, {} at the start{}{}", census->count(), baseline_->count(),
                                census->DifferenceFrom(*baseline_),
                                children == baseline_children_
                                    ? ""
                                    : fmt::format("; children at the start: {}; now: {}", baseline_children_, children)));
      const int weights = census->weights, parked = census->parked;
      int ready_models = 0, parked_models = 0, lm_caches = 0;
      HeldRegions(&ready_models, &parked_models, &lm_caches);
      checks.Expect(weights + parked == ready_models + parked_models + kept,
                    "the supervisor holds the weights of exactly the ready models, one host copy "
                    "per parked model, and the freed regions it says it keeps",
                    fmt::format("{} weight regions for {} ready models, {} host copies for {} parked, "
                                "{} kept", weights, ready_models, parked, parked_models, kept));
      // Quiet, no retried generation holds a dead replica's cache: one per serving replica of a
      // language model on the CPU (a GPU's engine keeps its cache in device memory: none there),
      // and one per parked language model that kept its cache.
      const bool on_cpu = Backend() == "host";
      checks.Expect(on_cpu ? census->kv_caches == lm_caches : census->kv_caches <= lm_caches,
                    "the supervisor holds the KV cache of exactly the language models' replicas and parked copies",
                    fmt::format("{} KV cache regions for {} replicas and parked caches", census->kv_caches,
                                lm_caches));
    }
    auto status = (*client)->GetStatus();
    std::set<pid_t> live;
    if (status.ok()) {
      for (const auto& w : status->workers()) live.insert(w.pid());
    }
    std::vector<pid_t> orphans;
    for (pid_t pid : workers_seen_) {
      if (live.count(pid) == 0 && kill(pid, 0) == 0) orphans.push_back(pid);
    }
    checks.Expect(orphans.empty(), "no orphan worker",
                  fmt::format("{} dead workers still running", orphans.size()));
  }
}

uint32_t Harness::TotalRestarts() {
  auto client = Connect();
  if (!client.ok()) return 0;
  auto status = (*client)->GetStatus();
  if (!status.ok()) return 0;
  uint32_t total = 0;
  for (const auto& w : status->workers()) total += w.restarts();
  return total;
}

std::string Harness::SegmentDump() {
  auto segment = shm::SharedSegment::Open(instance_, /*read_only=*/true);
  if (!segment.ok()) return "segment: " + segment.status().ToString() + "\n";
  const shm::SegmentView& v = segment->view();
  const shm::SegmentHeader& h = v.header();
  std::string out = fmt::format("segment {}: supervisor {} lru {}..{} ({})", segment->name(),
                                h.supervisor_pid, h.lru_head, h.lru_tail, h.lru_length);
  for (uint32_t d = 0; d < h.device_count && d < shm::kMaxDevices; d++) {
    out += fmt::format(" device {} used {} of {}", d, h.device_used_bytes[d], h.device_budget_bytes[d]);
  }
  out += "\n";
  for (uint32_t i = 0; i < h.max_models; i++) {
    const shm::ModelRecord& m = v.model(i);
    if (m.state == 0) continue;
    out += fmt::format("  model {:3} {:12} {:10} worker {:>10} bytes {:>9} inflight {} lru {}<{}> "
                       "err \"{}\"\n",
                       i, m.name, shm::ModelStateName(static_cast<shm::ModelState>(m.state)),
                       m.worker_slot, m.weight_bytes + m.workspace_bytes, m.inflight, m.lru_prev,
                       m.lru_next, m.last_error);
  }
  for (uint32_t i = 0; i < h.max_workers; i++) {
    const shm::WorkerRecord& w = v.worker(i);
    out += fmt::format("  worker {} pid {} generation {} state {} restarts {} last_exit {}\n", i,
                       w.pid, w.generation, w.state, w.restarts, w.last_exit);
  }
  shm::InflightTable inflight(v);
  for (uint32_t i = 0; i < h.max_inflight; i++) {
    uint64_t tag = inflight.Tag(i);
    if (tag == 0) continue;
    out += fmt::format("  inflight {} worker {} generation {} job {} model {}\n", i,
                       shm::TagWorker(tag), shm::TagGeneration(tag), v.inflight(i).request_id,
                       v.inflight(i).model);
  }
  return out;
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
