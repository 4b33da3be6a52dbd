#include "bench/abuse.h"

#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/skeleton.h"
#include "bench/stats.h"
#include "ipc/framing.h"

namespace warmpool::bench {
namespace {

using Clock = std::chrono::steady_clock;

// VmRSS (or another Vm* field) of a process, bytes; 0 when it cannot be read.
uint64_t VmField(pid_t pid, const char* field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  size_t n = std::strlen(field);
  while (std::getline(in, line)) {
    if (line.compare(0, n, field) == 0 && line.size() > n && line[n] == ':') {
      return std::stoull(line.substr(n + 1)) * 1024;
    }
  }
  return 0;
}

// A client that pushes the same large request as fast as the socket takes it until `until`, and
// never reads: what it sent, and whether the daemon hung up on it.
struct Greedy {
  uint64_t sent = 0;
  bool cut_off = false;
};

Greedy Push(const std::string& socket, const std::string& frame, Clock::time_point until) {
  Greedy g;
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", socket.c_str());
  if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    if (fd >= 0) close(fd);
    g.cut_off = true;
    return g;
  }
  timeval slice{0, 200000};  // writes give up now and then, so that the deadline is kept
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &slice, sizeof(slice));
  size_t offset = 0;
  while (Clock::now() < until) {
    ssize_t n = ::send(fd, frame.data() + offset, frame.size() - offset, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
      g.cut_off = true;
      break;
    }
    offset += static_cast<size_t>(n);
    if (offset == frame.size()) {
      offset = 0;
      g.sent++;
    }
  }
  close(fd);  // gone, with every reply unread
  return g;
}

struct Phase {
  std::string name;
  uint64_t idle_rss = 0, peak_rss = 0, after_rss = 0, hwm = 0;
  uint64_t greedy_sent = 0;
  uint32_t greedy_cut_off = 0;
  uint64_t polite_ok = 0, polite_failed = 0;
  double polite_p50_ms = 0, polite_max_ms = 0;
  std::string first_polite_error;
};

class Abuse {
 public:
  Abuse(AbuseOptions options, BenchRun& run) : options_(std::move(options)), run_(run) {}

  Status Run() {
    if (options_.greedy == 0 || options_.payload_mib == 0 || options_.seconds == 0) {
      return Error(Code::kInvalidArgument, "--greedy, --payload-mib and --seconds must be >= 1");
    }
    if (options_.payload_mib >= 64) {
      return Error(Code::kInvalidArgument, "--payload-mib must be under the 64 MiB frame limit");
    }
    const char* echo = "[[models]]\nname = \"echo\"\nengine = \"echo\"\n";
    Phase bounded, unbounded;
    bounded.name = "default limits";
    if (Status s = RunPhase(std::string("[pool]\nmax_queue = 100000\n") + echo, bounded); !s.ok()) {
      return s;
    }
    unbounded.name = "limits raised";
    std::string raised = std::string("[pool]\nmax_queue = 100000\n") +
                         "[limits]\nmax_queued_bytes = \"64GiB\"\n"
                         "max_queued_bytes_per_connection = \"64GiB\"\n"
                         "max_unread_reply_bytes = \"64GiB\"\n"
                         "max_requests_per_connection = 1000000\n" +
                         echo;
    if (Status s = RunPhase(raised, unbounded); !s.ok()) return s;
    Report(bounded, unbounded);
    return OkStatus();
  }

 private:
  Status RunPhase(const std::string& config, Phase& p) {
    if (Status s = run_.StartDaemon(options_.daemon, options_.backend, config); !s.ok()) return s;
    pid_t pid = run_.daemon().pid();
    Result<std::unique_ptr<client::Client>> polite = run_.Connect();
    if (!polite.ok()) return polite.status();
    if (Result<v1::LoadReply> r = (*polite)->Load("echo"); !r.ok()) return run_.WithLog(r.status());
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    p.idle_rss = VmField(pid, "VmRSS");

    client::Matrix big{1, options_.payload_mib * (1u << 18), {}};
    big.data.assign(big.cols, 0.5f);
    std::string frame = ipc::Frame(client::InferRequest("echo", big));
    client::Matrix small{1, 256, std::vector<float>(256, 0.25f)};

    auto until = Clock::now() + std::chrono::seconds(options_.seconds);
    std::atomic<bool> sampling{true};
    std::atomic<uint64_t> peak{p.idle_rss};
    std::thread sampler([&] {
      while (sampling.load()) {
        uint64_t rss = VmField(pid, "VmRSS");
        if (rss > peak.load()) peak = rss;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    });
    std::vector<Greedy> results(options_.greedy);
    std::vector<std::thread> greedy;
    for (uint32_t i = 0; i < options_.greedy; i++) {
      greedy.emplace_back([&, i] { results[i] = Push(run_.daemon().spec().socket, frame, until); });
    }
    std::vector<uint64_t> latencies;
    while (Clock::now() < until) {
      auto t0 = Clock::now();
      Result<client::Matrix> out = (*polite)->Infer("echo", small);
      latencies.push_back(static_cast<uint64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count()));
      if (out.ok()) {
        p.polite_ok++;
      } else {
        p.polite_failed++;
        if (p.first_polite_error.empty()) p.first_polite_error = out.status().ToString();
        if (out.status().code() == Code::kUnavailable) break;  // the connection is gone
      }
    }
    for (std::thread& t : greedy) t.join();
    // The greedy clients are gone: what does the daemon keep?
    std::this_thread::sleep_for(std::chrono::seconds(2));
    sampling = false;
    sampler.join();
    p.peak_rss = peak.load();
    p.after_rss = VmField(pid, "VmRSS");
    p.hwm = VmField(pid, "VmHWM");
    for (const Greedy& g : results) {
      p.greedy_sent += g.sent;
      p.greedy_cut_off += g.cut_off;
    }
    if (!latencies.empty()) {
      std::sort(latencies.begin(), latencies.end());
      p.polite_p50_ms = Percentile(latencies, 50) / 1e6;
      p.polite_max_ms = latencies.back() / 1e6;
    }
    polite->reset();
    return run_.StopDaemon();
  }

  void Report(const Phase& bounded, const Phase& raised) {
    auto mib = [](uint64_t b) { return b / 1048576.0; };
    if (options_.json) {
      auto phase = [&](const Phase& p) {
        return fmt::format(
            "{{\"idle_rss_mib\": {:.1f}, \"peak_rss_mib\": {:.1f}, \"vm_hwm_mib\": {:.1f}, "
            "\"after_rss_mib\": {:.1f}, \"greedy_requests_sent\": {}, \"greedy_cut_off\": {}, "
            "\"polite_ok\": {}, \"polite_failed\": {}, \"polite_p50_ms\": {:.2f}, "
            "\"polite_max_ms\": {:.2f}}}",
            mib(p.idle_rss), mib(p.peak_rss), mib(p.hwm), mib(p.after_rss), p.greedy_sent,
            p.greedy_cut_off, p.polite_ok, p.polite_failed, p.polite_p50_ms, p.polite_max_ms);
      };
      std::printf("{\"greedy\": %u, \"payload_mib\": %u, \"seconds\": %u, \"default_limits\": %s, "
                  "\"limits_raised\": %s, \"peak_ratio\": %.3f}\n",
                  options_.greedy, options_.payload_mib, options_.seconds, phase(bounded).c_str(),
                  phase(raised).c_str(),
                  raised.peak_rss > 0 ? static_cast<double>(bounded.peak_rss) / raised.peak_rss : 0);
      return;
    }
    std::string out = fmt::format(
        "warmpool-bench --abuse: {} greedy clients pipeline {} MiB echo requests for {} s and never "
        "read a reply, then vanish; a polite client sends 1 KiB requests meanwhile\n\n",
        options_.greedy, options_.payload_mib, options_.seconds);
    out += fmt::format("{:<16} {:>10} {:>10} {:>10} {:>10} {:>8} {:>8} {:>10} {:>10}\n", "daemon",
                       "idle MiB", "peak MiB", "HWM MiB", "after MiB", "sent", "cut off",
                       "polite ok", "polite max");
    for (const Phase* p : {&bounded, &raised}) {
      out += fmt::format("{:<16} {:>10.1f} {:>10.1f} {:>10.1f} {:>10.1f} {:>8} {:>8} {:>10} {:>8.1f}ms\n",
                         p->name, mib(p->idle_rss), mib(p->peak_rss), mib(p->hwm),
                         mib(p->after_rss), p->greedy_sent, p->greedy_cut_off, p->polite_ok,
                         p->polite_max_ms);
      if (!p->first_polite_error.empty()) {
        out += fmt::format("  polite client: {} failed, first: {}\n", p->polite_failed,
                           p->first_polite_error);
      }
    }
    out += fmt::format("\npeak RSS with the default limits / with them raised: {:.2f}x\n",
                       raised.peak_rss > 0 ? static_cast<double>(bounded.peak_rss) / raised.peak_rss
                                           : 0.0);
    std::fputs(out.c_str(), stdout);
  }

  AbuseOptions options_;
  BenchRun& run_;
};

}  // namespace

int RunAbuse(const AbuseOptions& options) {
  return BenchRun::Main("--abuse", [&](BenchRun& run) { return Abuse(options, run).Run(); });
}

}  // namespace warmpool::bench
