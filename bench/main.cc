// warmpool-bench: round-trip latency of `infer` on the echo model through warmpoold, compared in the
// same run with a raw two-hop Unix-socket relay that carries the identical frames (see relay.h).
// It is a report: it prints numbers and ratios against the targets and asserts nothing about them.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <latch>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/command_line.h"

#include "bench/daemon.h"
#include "bench/recovery.h"
#include "bench/relay.h"
#include "bench/session.h"
#include "bench/sharing.h"
#include "bench/stats.h"
#include "ipc/framing.h"

namespace warmpool::bench {
namespace {

constexpr double kTargetP50 = 1.5;
constexpr double kTargetP99 = 2.0;
constexpr int kStartupTimeoutMs = 10000;
constexpr int kStopTimeoutMs = 10000;

struct Options {
  std::string daemon;
  std::string backend = "host";
  uint64_t requests = 20000;
  uint64_t warmup = 2000;
  uint64_t payload = 1024;
  uint32_t clients = 1;
  uint32_t rounds = 4;
  bool json = false;
  // --recovery
  bool recovery = false;
  uint32_t iterations = 20;
  uint64_t model_mib = 16;
  uint32_t inflight = 8;
  uint32_t rows = 64;
  // --sharing
  bool sharing = false;
  std::vector<uint64_t> sizes_mib = {16, 1024};
  uint32_t poll_us = 50;
  uint32_t features = 0;
};

using Sessions = std::vector<std::unique_ptr<Session>>;

// Children for the signal handler: killed if the benchmark is interrupted.
std::atomic<pid_t> g_daemon_pid{-1}, g_relay_pid{-1}, g_server_pid{-1};

// The temporary directory's entries, children first, prepared before the handler is installed:
// unlink(2) and rmdir(2) are async-signal-safe, std::filesystem is not.
constexpr int kMaxCleanupPaths = 8;
char g_cleanup_paths[kMaxCleanupPaths][512];
int g_cleanup_count = 0;

void PrepareSignalCleanup(const std::string& dir) {
  for (const char* name : {"/warmpool.toml", "/warmpoold.sock", "/warmpoold.log",
                           "/echo-server.sock", "/relay.sock", "/models", ""}) {
    std::string path = dir + name;
    if (path.size() >= sizeof(g_cleanup_paths[0]) || g_cleanup_count >= kMaxCleanupPaths) return;
    std::memcpy(g_cleanup_paths[g_cleanup_count++], path.c_str(), path.size() + 1);
  }
}

void OnSignal(int sig) {
  for (auto* p : {&g_relay_pid, &g_server_pid}) {
    if (pid_t pid = p->load(); pid > 0) kill(pid, SIGKILL);
  }
  if (pid_t pid = g_daemon_pid.load(); pid > 0) kill(pid, SIGTERM);  // it drains its workers
  for (int i = 0; i < g_cleanup_count; ++i) {
    if (unlink(g_cleanup_paths[i]) != 0) rmdir(g_cleanup_paths[i]);
  }
  _exit(128 + sig);
}

// Runs `total` closed-loop round trips split over the sessions, one thread each, all released at
// once; appends every latency to out and returns the wall time from release to the last reply.
Result<double> RunPhase(Sessions& sessions, uint64_t total, std::vector<uint64_t>* out) {
  size_t n = sessions.size();
  std::vector<std::vector<uint64_t>> latencies(n);
  std::vector<Status> errors(n);
  std::latch ready(static_cast<std::ptrdiff_t>(n));
  std::latch go(1);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < n; ++i) {
    uint64_t count = total / n + (i < total % n ? 1 : 0);
    threads.emplace_back([&, i, count] {
      latencies[i].reserve(count);
      ready.count_down();
      go.wait();
      for (uint64_t k = 0; k < count; ++k) {
        auto t0 = std::chrono::steady_clock::now();
        Status s = sessions[i]->RoundTrip();
        auto t1 = std::chrono::steady_clock::now();
        if (!s.ok()) {
          errors[i] = std::move(s);
          return;
        }
        latencies[i].push_back(
            std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count());
      }
    });
  }
  ready.wait();
  auto start = std::chrono::steady_clock::now();
  go.count_down();
  for (std::thread& t : threads) t.join();
  double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (size_t i = 0; i < n; ++i) {
    if (!errors[i].ok()) return errors[i];
  }
  if (out != nullptr) {
    for (auto& l : latencies) out->insert(out->end(), l.begin(), l.end());
  }
  return wall;
}

struct Measured {
  std::vector<uint64_t> latencies;
  double wall_s = 0;
};

std::string SummaryJson(const Summary& s) {
  return fmt::format(
      "{{\"count\": {}, \"p50_us\": {:.2f}, \"p99_us\": {:.2f}, \"mean_us\": {:.2f}, "
      "\"min_us\": {:.2f}, \"max_us\": {:.2f}, \"requests_per_s\": {:.0f}, \"wall_s\": {:.3f}}}",
      s.count, s.p50_us, s.p99_us, s.mean_us, s.min_us, s.max_us, s.requests_per_s, s.wall_s);
}

std::string Verdict(double ratio, double target) {
  return ratio <= target ? "met" : "NOT met";
}

class Bench {
 public:
  explicit Bench(Options options) : options_(std::move(options)) {}
  ~Bench() { Cleanup(); }

  int Run() {
    Status s = RunAll();
    if (!s.ok()) {
      std::fprintf(stderr, "warmpool-bench: error: %s\n", s.ToString().c_str());
      Cleanup();
      return 1;
    }
    return 0;
  }

 private:
  Status RunAll() {
    if (options_.payload < sizeof(float)) {
      return Error(Code::kInvalidArgument, "--payload must be at least 4 bytes (one float)");
    }
    if (options_.clients == 0) return Error(Code::kInvalidArgument, "--clients must be >= 1");
    if (options_.rounds == 0) return Error(Code::kInvalidArgument, "--rounds must be >= 1");
    if (options_.requests < options_.clients) {
      return Error(Code::kInvalidArgument, "--requests must be at least --clients");
    }
    input_.rows = 1;
    input_.cols = static_cast<uint32_t>(options_.payload / sizeof(float));
    input_.data.resize(input_.cols);
    for (uint32_t i = 0; i < input_.cols; ++i) input_.data[i] = static_cast<float>(i) * 0.5f;
    request_frame_bytes_ =
        ipc::Frame(MakeInferRequest(model_, input_, options_.warmup + options_.requests, false))
            .size();

    // Temporary directory: config, daemon socket and log, baseline sockets.
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp != nullptr && tmp[0] != '\0' ? tmp : "/tmp") +
                          "/warmpool-bench-XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) {
      return Error(Code::kInternal, "mkdtemp {}: {}", pattern, std::strerror(errno));
    }
    dir_ = pattern;

    signal(SIGPIPE, SIG_IGN);
    PrepareSignalCleanup(dir_);
    signal(SIGINT, OnSignal);
    signal(SIGTERM, OnSignal);

    // Every fork happens here, while this process still has a single thread.
    DaemonOptions daemon_options;
    daemon_options.binary =
        options_.daemon.empty() ? NextToSelf("warmpoold") : options_.daemon;
    daemon_options.directory = dir_;
    daemon_options.instance = fmt::format("bench-{}", getpid());
    daemon_options.backend = options_.backend;
    daemon_options.model = model_;
    daemon_ = std::make_unique<Daemon>(daemon_options);
    if (Status s = daemon_->Spawn(); !s.ok()) return s;
    g_daemon_pid = daemon_->pid();

    std::string server_socket = dir_ + "/echo-server.sock";
    std::string relay_socket = dir_ + "/relay.sock";
    Result<pid_t> server = ForkEchoServer(server_socket);
    if (!server.ok()) return server.status();
    server_pid_ = *server;
    g_server_pid = server_pid_;
    Result<pid_t> relay = ForkRelay(relay_socket, server_socket);
    if (!relay.ok()) return relay.status();
    relay_pid_ = *relay;
    g_relay_pid = relay_pid_;

    if (Status s = daemon_->WaitReady(kStartupTimeoutMs); !s.ok()) return s;
    {
      Result<std::unique_ptr<client::Client>> admin = client::Client::Connect(daemon_->socket_path());
      if (!admin.ok()) return admin.status();
      SetReceiveTimeout((*admin)->fd());
      Result<v1::LoadReply> load = (*admin)->Load(model_);
      if (!load.ok()) {
        return Error(load.status().code(), "loading \"{}\" failed: {}; warmpoold log:\n{}", model_,
                     load.status().ToString(), daemon_->LogTail());
      }
    }

    Sessions relay_sessions, warmpool_sessions;
    for (uint32_t i = 0; i < options_.clients; ++i) {
      Result<std::unique_ptr<Session>> r = ConnectRelay(relay_socket, model_, input_);
      if (!r.ok()) return Error(r.status().code(), "baseline relay: {}", r.status().message());
      relay_sessions.push_back(std::move(*r));
      Result<std::unique_ptr<Session>> w = ConnectWarmpool(daemon_->socket_path(), model_, input_);
      if (!w.ok()) return w.status();
      warmpool_sessions.push_back(std::move(*w));
    }

    // Warm-up of both paths, then measured rounds interleaved ABBA so that drift in machine load
    // (a shared, noisy host) falls on both sides alike.
    if (options_.warmup > 0) {
      if (Result<double> r = RunPhase(relay_sessions, options_.warmup, nullptr); !r.ok()) {
        return Error(r.status().code(), "baseline relay: {}", r.status().message());
      }
      if (Result<double> r = RunPhase(warmpool_sessions, options_.warmup, nullptr); !r.ok()) {
        return WithLog(r.status());
      }
    }
    Measured relay_m, warmpool_m;
    relay_m.latencies.reserve(options_.requests);
    warmpool_m.latencies.reserve(options_.requests);
    uint32_t rounds = static_cast<uint32_t>(
        std::min<uint64_t>(options_.rounds, options_.requests / options_.clients));
    for (uint32_t round = 0; round < rounds; ++round) {
      uint64_t count = options_.requests / rounds + (round < options_.requests % rounds ? 1 : 0);
      for (int half = 0; half < 2; ++half) {
        bool relay_turn = (round % 2 == 0) == (half == 0);
        if (relay_turn) {
          Result<double> r = RunPhase(relay_sessions, count, &relay_m.latencies);
          if (!r.ok()) return Error(r.status().code(), "baseline relay: {}", r.status().message());
          relay_m.wall_s += *r;
        } else {
          Result<double> r = RunPhase(warmpool_sessions, count, &warmpool_m.latencies);
          if (!r.ok()) return WithLog(r.status());
          warmpool_m.wall_s += *r;
        }
      }
    }
    relay_sessions.clear();
    warmpool_sessions.clear();

    Summary relay_s = Summarize(relay_m.latencies, relay_m.wall_s);
    Summary warmpool_s = Summarize(warmpool_m.latencies, warmpool_m.wall_s);

    // Stop everything before reporting, so a daemon that fails to stop is reported too.
    StopBaseline();
    Status stopped = daemon_->Stop(kStopTimeoutMs);
    g_daemon_pid = -1;

    Report(relay_s, warmpool_s, rounds);
    if (!stopped.ok()) return stopped;
    RemoveDir();
    return OkStatus();
  }

  Status WithLog(const Status& s) {
    return Error(s.code(), "warmpool: {}; warmpoold log:\n{}", s.message(), daemon_->LogTail());
  }

  void Report(const Summary& relay, const Summary& warmpool, uint32_t rounds) {
    double r50 = relay.p50_us > 0 ? warmpool.p50_us / relay.p50_us : 0;
    double r99 = relay.p99_us > 0 ? warmpool.p99_us / relay.p99_us : 0;
    if (options_.json) {
      std::printf(
          "%s\n",
          fmt::format("{{\"model\": \"{}\", \"payload_bytes\": {}, \"request_frame_bytes\": {}, "
                      "\"clients\": {}, \"requests\": {}, \"warmup\": {}, \"rounds\": {}, "
                      "\"relay\": {}, \"warmpool\": {}, \"ratio_p50\": {:.3f}, \"ratio_p99\": "
                      "{:.3f}, \"target_p50\": {}, \"target_p99\": {}, \"p50_target_met\": {}, "
                      "\"p99_target_met\": {}}}",
                      model_, input_.cols * sizeof(float), request_frame_bytes_, options_.clients,
                      options_.requests, options_.warmup, rounds, SummaryJson(relay),
                      SummaryJson(warmpool), r50, r99, kTargetP50, kTargetP99,
                      r50 <= kTargetP50, r99 <= kTargetP99)
              .c_str());
      return;
    }
    std::string out = fmt::format(
        "warmpool-bench: infer on \"{}\" (echo engine), payload {} B (request frame {} B), "
        "{} client(s), {} requests + {} warm-up per path, {} interleaved rounds\n\n",
        model_, input_.cols * sizeof(float), request_frame_bytes_, options_.clients,
        options_.requests, options_.warmup, rounds);
    out += fmt::format("{:<10} {:>10} {:>10} {:>10} {:>12}\n", "path", "p50 us", "p99 us",
                       "mean us", "req/s");
    for (auto [name, s] : {std::pair<const char*, const Summary&>{"relay", relay},
                           std::pair<const char*, const Summary&>{"warmpool", warmpool}}) {
      out += fmt::format("{:<10} {:>10.1f} {:>10.1f} {:>10.1f} {:>12.0f}\n", name, s.p50_us,
                         s.p99_us, s.mean_us, s.requests_per_s);
    }
    out += fmt::format("\nratio p50 {:.2f}x (target <= {}x): {}\n", r50, kTargetP50,
                       Verdict(r50, kTargetP50));
    out += fmt::format("ratio p99 {:.2f}x (target <= {}x): {}\n", r99, kTargetP99,
                       Verdict(r99, kTargetP99));
    std::fputs(out.c_str(), stdout);
  }

  void StopBaseline() {
    for (pid_t* pid : {&relay_pid_, &server_pid_}) {
      if (*pid <= 0) continue;
      kill(*pid, SIGKILL);
      int status = 0;
      while (waitpid(*pid, &status, 0) < 0 && errno == EINTR) {
      }
      *pid = -1;
    }
    g_relay_pid = -1;
    g_server_pid = -1;
  }

  void RemoveDir() {
    if (dir_.empty()) return;
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
    dir_.clear();
  }

  void Cleanup() {
    StopBaseline();
    if (daemon_ != nullptr && daemon_->pid() > 0) {
      (void)daemon_->Stop(kStopTimeoutMs);  // SIGTERM, then SIGKILL if it does not stop
    }
    g_daemon_pid = -1;
    daemon_.reset();
    RemoveDir();
  }

  Options options_;
  std::string model_ = "echo";
  client::Matrix input_;
  size_t request_frame_bytes_ = 0;
  std::string dir_;
  std::unique_ptr<Daemon> daemon_;
  pid_t relay_pid_ = -1;
  pid_t server_pid_ = -1;
};

}  // namespace
}  // namespace warmpool::bench

int main(int argc, char** argv) {
  warmpool::bench::Options options;
  CLI::App app{
      "warmpool-bench: round-trip latency of `infer` on the echo model through a private warmpoold, "
      "compared in the same run with a raw two-hop Unix-socket relay carrying identical frames "
      "(client -> relay -> echo server -> relay -> client). Prints p50/p99/mean latency, "
      "throughput and the warmpool/relay ratios; asserts nothing."};
  app.add_option("--daemon", options.daemon,
                 "warmpoold binary (default: warmpoold next to warmpool-bench)");
  app.add_option("--requests", options.requests,
                 "measured requests per path, in total over all clients")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--warmup", options.warmup, "warm-up requests per path, not measured")
      ->capture_default_str();
  app.add_option("--payload", options.payload,
                 "input tensor bytes (f32, 1 row, payload/4 columns)")
      ->capture_default_str();
  app.add_option("--clients", options.clients,
                 "concurrent closed-loop clients, one thread and one connection each")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--rounds", options.rounds,
                 "measured rounds, alternating relay and warmpool (ABBA)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--backend", options.backend, "warmpoold --backend: host, cuda or auto")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "host", "cuda"}));
  app.add_flag("--json", options.json, "print one JSON object instead of the table");
  app.add_flag("--recovery", options.recovery,
               "instead: recovery after SIGKILL of a busy worker serving a dense model, against a "
               "warm load from the page cache (see bench/recovery.h)");
  app.add_flag("--sharing", options.sharing,
               "instead: supervisor-held weights: cold load vs cat, replica attach time, PSS of "
               "4 replicas and unpark vs memcpy, per model size (see bench/sharing.h)");
  app.add_option("--sizes-mib", options.sizes_mib, "--sharing: model sizes, MiB of f32 weights")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--poll-us", options.poll_us,
                 "--sharing: sleep between two ps polls while waiting for a replica")
      ->capture_default_str();
  app.add_option("--features", options.features,
                 "--sharing: input and output width of the generated MLPs (0: square, in = out ~ "
                 "hidden; the per-replica workspace grows with the hidden width)")
      ->capture_default_str();
  CLI::Option* iterations =
      app.add_option("--iterations", options.iterations,
                     "--recovery: kills (and baseline loads); --sharing: cat + load pairs, attach "
                     "sequences and unparks per size (default 10 there)")
          ->capture_default_str()
          ->check(CLI::PositiveNumber);
  app.add_option("--model-mib", options.model_mib, "--recovery: MiB of f32 weights in the model")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--inflight", options.inflight,
                 "--recovery: requests pipelined on the worker when it is killed")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--rows", options.rows, "--recovery: rows of each of those requests")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.get_option("--recovery")->excludes("--sharing");
  if (int rc = warmpool::ParseCommandLine(app, argc, argv); rc >= 0) return rc;
  if (options.sharing) {
    warmpool::bench::SharingOptions sharing;
    sharing.daemon = options.daemon;
    sharing.backend = options.backend;
    if (iterations->count() > 0) sharing.iterations = options.iterations;
    sharing.sizes_mib = options.sizes_mib;
    sharing.poll_us = options.poll_us;
    sharing.features = options.features;
    sharing.json = options.json;
    return warmpool::bench::RunSharing(sharing);
  }
  if (options.recovery) {
    warmpool::bench::RecoveryOptions recovery;
    recovery.daemon = options.daemon;
    recovery.backend = options.backend;
    recovery.iterations = options.iterations;
    recovery.model_mib = options.model_mib;
    recovery.inflight = options.inflight;
    recovery.rows = options.rows;
    recovery.json = options.json;
    return warmpool::bench::RunRecovery(recovery);
  }
  return warmpool::bench::Bench(std::move(options)).Run();
}
