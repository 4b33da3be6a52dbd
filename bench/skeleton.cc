#include "bench/skeleton.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "bench/session.h"
#include "common/paths.h"

namespace warmpool::bench {

namespace {

constexpr int kStartupTimeoutMs = 10000;
constexpr int kStopTimeoutMs = 10000;

// What the signal handler undoes, kept ready before it is installed: kill(2), unlink(2) and
// rmdir(2) are async-signal-safe, std::filesystem is not.
constexpr int kMaxChildren = 8;
constexpr int kMaxPaths = 32;
std::atomic<pid_t> g_daemon{-1};
std::atomic<pid_t> g_children[kMaxChildren];
char g_paths[kMaxPaths][512];
std::atomic<int> g_path_count{0};

void AddPath(const std::string& path) {
  int n = g_path_count.load();
  if (n >= kMaxPaths || path.size() >= sizeof(g_paths[0])) return;
  std::memcpy(g_paths[n], path.c_str(), path.size() + 1);
  g_path_count.store(n + 1);
}

void OnSignal(int sig) {
  for (auto& child : g_children) {
    if (pid_t pid = child.load(); pid > 0) kill(pid, SIGKILL);
  }
  if (pid_t pid = g_daemon.load(); pid > 0) kill(pid, SIGTERM);  // it drains its workers
  for (int i = g_path_count.load() - 1; i >= 0; --i) {  // files before their directory
    if (unlink(g_paths[i]) != 0) rmdir(g_paths[i]);
  }
  _exit(128 + sig);
}

}  // namespace

BenchRun::BenchRun() = default;

BenchRun::~BenchRun() { Cleanup(); }

int BenchRun::Main(const std::string& mode, const std::function<Status(BenchRun&)>& body) {
  BenchRun run;
  Status s = run.MakeScratch();
  if (s.ok()) s = body(run);
  if (!s.ok()) {
    std::fprintf(stderr, "warmpool-bench%s%s: error: %s\n", mode.empty() ? "" : " ", mode.c_str(), s.ToString().c_str());
    return 1;
  }
  return 0;
}

Status BenchRun::MakeScratch() {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp != nullptr && tmp[0] != '\0' ? tmp : "/tmp") +
                        "/warmpool-bench-XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) {
    return Error(Code::kInternal, "mkdtemp {}: {}", pattern, std::strerror(errno));
  }
  dir_ = pattern;
  AddPath(dir_);
  for (const char* name : {"/models", "/warmpool.toml", "/warmpoold.sock", "/daemon.log"}) {
    AddPath(dir_ + name);
  }
  signal(SIGPIPE, SIG_IGN);
  signal(SIGINT, OnSignal);
  signal(SIGTERM, OnSignal);
  return OkStatus();
}

std::string BenchRun::File(const std::string& name) {
  std::string path = dir_ + "/" + name;
  AddPath(path);
  return path;
}

Status BenchRun::StartDaemon(const std::string& binary, const std::string& backend,
                             const std::string& config_text) {
  std::string config = dir_ + "/warmpool.toml";
  {
    std::ofstream out(config);
    out << config_text;
    if (!out) return Error(Code::kInternal, "cannot write {}", config);
  }
  std::error_code ec;
  std::filesystem::create_directory(dir_ + "/models", ec);
  launch::DaemonSpec spec;
  spec.binary = binary.empty() ? NextToSelf("warmpoold") : binary;
  spec.directory = dir_;
  spec.socket = dir_ + "/warmpoold.sock";
  spec.instance = fmt::format("bench-{}", getpid());
  spec.config = config;
  spec.models_dir = dir_ + "/models";
  if (!backend.empty()) spec.args = {"--backend", backend};
  spec.die_with_parent = true;  // if the benchmark dies, the daemon drains and exits
  if (manager_ != nullptr) manager_->PrepareStart(spec);
  daemon_ = std::make_unique<launch::DaemonProcess>(spec);
  if (Status s = daemon_->Start(); !s.ok()) return s;
  g_daemon = daemon_->pid();
  return daemon_->WaitReady(kStartupTimeoutMs);
}

Status BenchRun::KillAndStartAgain() {
  if (daemon_ == nullptr) return Error(Code::kFailedPrecondition, "no daemon to restart");
  launch::DaemonSpec spec = daemon_->spec();
  daemon_->Kill();
  g_daemon = -1;
  spec.env.clear();
  if (manager_ != nullptr) manager_->PrepareStart(spec);
  daemon_ = std::make_unique<launch::DaemonProcess>(spec);
  if (Status s = daemon_->Start(); !s.ok()) return s;
  g_daemon = daemon_->pid();
  return OkStatus();
}

Result<std::unique_ptr<client::Client>> BenchRun::Connect() const {
  Result<std::unique_ptr<client::Client>> c = client::Client::Connect(daemon_->spec().socket);
  if (!c.ok()) return c.status();
  SetReceiveTimeout((*c)->fd());
  return c;
}

Status BenchRun::WithLog(const Status& status) const {
  if (!daemon_) return status;
  return Error(status.code(), "{}; warmpoold log:\n{}", status.ToString(), daemon_->LogTail());
}

Status BenchRun::StopDaemon() {
  if (!daemon_ || !daemon_->running()) return OkStatus();
  int exit = daemon_->Stop(kStopTimeoutMs);
  g_daemon = -1;
  if (exit == 0) return OkStatus();
  return Error(Code::kInternal, "warmpoold {} on SIGTERM; its log:\n{}",
               exit < 0 ? std::string("did not stop in time (killed)")
                        : fmt::format("exited with status {}", exit),
               daemon_->LogTail());
}

void BenchRun::AddChild(pid_t pid) {
  for (auto& child : g_children) {
    if (child.load() <= 0) {
      child = pid;
      return;
    }
  }
}

void BenchRun::StopChildren() {
  for (auto& child : g_children) {
    pid_t pid = child.exchange(-1);
    if (pid <= 0) continue;
    kill(pid, SIGKILL);
    while (waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
    }
  }
}

void BenchRun::Cleanup() {
  StopChildren();
  if (daemon_ && daemon_->running()) (void)StopDaemon();
  g_daemon = -1;
  daemon_.reset();
  if (!dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
    dir_.clear();
  }
  g_path_count = 0;
}

std::string JsonEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\u{:04x}", static_cast<int>(c));
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace warmpool::bench
