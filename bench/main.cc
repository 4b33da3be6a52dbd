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

#include "bench/skeleton.h"
#include "bench/abuse.h"
#include "bench/compute.h"
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
  // --abuse
  bool abuse = false;
  uint32_t greedy = 4;
  uint32_t payload_mib = 4;
  uint32_t seconds = 5;
  // --sharing
  bool sharing = false;
  std::vector<uint64_t> sizes_mib = {16, 1024};
  uint32_t poll_us = 50;
  uint32_t features = 0;
  // --compute
  bool compute = false;
  std::vector<uint32_t> layers = {4096, 16384, 4096};
  std::vector<uint32_t> batches = {1, 256};
  uint32_t threads = 1;
};

using Sessions = std::vector<std::unique_ptr<Session>>;

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
  Bench(Options options, BenchRun& run) : options_(std::move(options)), run_(run) {}

  Status Run() {
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

    // Every fork happens here, while this process still has a single thread.
    std::string config = fmt::format(
        "# generated by warmpool-bench\n[[models]]\nname = \"{}\"\nengine = \"echo\"\n", model_);
    if (Status s = run_.StartDaemon(options_.daemon, options_.backend, config); !s.ok()) return s;
    std::string server_socket = run_.File("echo-server.sock");
    std::string relay_socket = run_.File("relay.sock");
    Result<pid_t> server = ForkEchoServer(server_socket);
    if (!server.ok()) return server.status();
    run_.AddChild(*server);
    Result<pid_t> relay = ForkRelay(relay_socket, server_socket);
    if (!relay.ok()) return relay.status();
    run_.AddChild(*relay);
    {
      Result<std::unique_ptr<client::Client>> admin = run_.Connect();
      if (!admin.ok()) return admin.status();
      Result<v1::LoadReply> load = (*admin)->Load(model_);
      if (!load.ok()) return run_.WithLog(load.status());
    }

    Sessions relay_sessions, warmpool_sessions;
    for (uint32_t i = 0; i < options_.clients; ++i) {
      Result<std::unique_ptr<Session>> r = ConnectRelay(relay_socket, model_, input_);
      if (!r.ok()) return Error(r.status().code(), "baseline relay: {}", r.status().message());
      relay_sessions.push_back(std::move(*r));
      Result<std::unique_ptr<Session>> w =
          ConnectWarmpool(run_.daemon().spec().socket, model_, input_);
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
        return run_.WithLog(r.status());
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
          if (!r.ok()) return run_.WithLog(r.status());
          warmpool_m.wall_s += *r;
        }
      }
    }
    relay_sessions.clear();
    warmpool_sessions.clear();

    Summary relay_s = Summarize(relay_m.latencies, relay_m.wall_s);
    Summary warmpool_s = Summarize(warmpool_m.latencies, warmpool_m.wall_s);

    // Stop everything before reporting, so a daemon that fails to stop is reported too.
    run_.StopChildren();
    Status stopped = run_.StopDaemon();
    Report(relay_s, warmpool_s, rounds);
    return stopped;
  }

 private:
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

  Options options_;
  BenchRun& run_;
  std::string model_ = "echo";
  client::Matrix input_;
  size_t request_frame_bytes_ = 0;
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
  app.add_flag("--abuse", options.abuse,
               "instead: the daemon's memory under clients that pipeline large inputs and never "
               "read their replies, with the default limits and with them raised (see "
               "bench/abuse.h)");
  app.add_option("--greedy", options.greedy, "--abuse: greedy clients")->capture_default_str();
  app.add_option("--payload-mib", options.payload_mib, "--abuse: MiB of each greedy request")
      ->capture_default_str();
  app.add_option("--seconds", options.seconds, "--abuse: how long the greedy clients push")
      ->capture_default_str();
  app.add_flag("--compute", options.compute,
               "instead: the dense engine's arithmetic in-process, f32/f16/bf16 weights, against "
               "OpenBLAS on the f32 weights as numpy calls it (see bench/compute.h)");
  app.add_option("--layers", options.layers, "--compute: layer widths, in,hidden...,out")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--batches", options.batches, "--compute: rows per call, one measurement each")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--threads", options.threads, "--compute: threads of the engine and of OpenBLAS")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  app.get_option("--compute")->excludes("--sharing")->excludes("--recovery")->excludes("--abuse");
  app.get_option("--recovery")->excludes("--sharing");
  app.get_option("--abuse")->excludes("--sharing")->excludes("--recovery");
  if (int rc = warmpool::ParseCommandLine(app, argc, argv); rc >= 0) return rc;
  if (options.compute) {
    warmpool::bench::ComputeOptions compute;
    compute.layers = options.layers;
    compute.batches = options.batches;
    compute.rounds = options.rounds;
    compute.threads = options.threads;
    compute.json = options.json;
    return warmpool::bench::RunCompute(compute);
  }
  if (options.abuse) {
    warmpool::bench::AbuseOptions abuse;
    abuse.daemon = options.daemon;
    abuse.backend = options.backend;
    abuse.greedy = options.greedy;
    abuse.payload_mib = options.payload_mib;
    abuse.seconds = options.seconds;
    abuse.json = options.json;
    return warmpool::bench::RunAbuse(abuse);
  }
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
  return warmpool::bench::BenchRun::Main("", [&](warmpool::bench::BenchRun& run) {
    return warmpool::bench::Bench(options, run).Run();
  });
}
