#include "bench/recovery.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <latch>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "bench/daemon.h"
#include "bench/model_file.h"
#include "bench/recovery_log.h"
#include "bench/session.h"
#include "bench/stats.h"

namespace warmpool::bench {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kStartupTimeoutMs = 10000;
constexpr int kStopTimeoutMs = 10000;
constexpr int kQuiesceTimeoutMs = 60000;
constexpr int kProbeGiveUpMs = 30000;  // a new request still failing this long after the kill
constexpr double kTargetAllAnsweredMs = 10.0;
constexpr double kTargetFirstSuccessRatio = 2.0;
constexpr const char* kModel = "mlp";
// The daemon's [recovery] settings for this mode, printed with the results.
constexpr uint32_t kRespawnMinMs = 1;
constexpr uint32_t kRespawnMaxMs = 100;
constexpr uint32_t kCrashLoopCrashes = 1000000;

uint64_t Ns(Clock::duration d) {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(d).count());
}

// ---- interruption: stop the daemon, remove the private directory (and its large model file) ----

std::atomic<pid_t> g_daemon_pid{-1};
constexpr int kMaxCleanupPaths = 8;
char g_cleanup_paths[kMaxCleanupPaths][512];
int g_cleanup_count = 0;

void PrepareSignalCleanup(const std::string& dir) {
  for (const char* name : {"/mlp.safetensors", "/warmpool.toml", "/warmpoold.sock",
                           "/warmpoold.log", "/models", ""}) {
    std::string path = dir + name;
    if (path.size() >= sizeof(g_cleanup_paths[0]) || g_cleanup_count >= kMaxCleanupPaths) return;
    std::memcpy(g_cleanup_paths[g_cleanup_count++], path.c_str(), path.size() + 1);
  }
}

void OnSignal(int sig) {
  if (pid_t pid = g_daemon_pid.load(); pid > 0) kill(pid, SIGTERM);  // it drains its workers
  for (int i = 0; i < g_cleanup_count; ++i) {
    if (unlink(g_cleanup_paths[i]) != 0) rmdir(g_cleanup_paths[i]);
  }
  _exit(128 + sig);
}

// ---- one iteration's measurements ----

struct Sample {
  uint64_t all_answered_ns = 0;    // (a): kill -> last of the K replies
  uint64_t first_success_ns = 0;   // (b): kill -> first successful new request
  bool first_success = false;
  uint32_t answered_before_kill = 0;  // replies read before the kill (not affected)
  uint32_t affected = 0;              // replies after the kill
  uint32_t failed = 0;                // of the K, replies that were errors (or never came)
  uint32_t probe_failures = 0;        // new requests that failed before the first success
  uint32_t inflight_at_kill = 0;      // status.inflight just before the kill
  std::string first_error;
  RecoveryLogEvents log;
};

// Median and p90 of a list of nanosecond values, in ms.
struct Spread {
  uint64_t count = 0;
  double median_ms = 0;
  double p90_ms = 0;
};

Spread SpreadOf(std::vector<uint64_t> ns) {
  Spread s;
  s.count = ns.size();
  if (ns.empty()) return s;
  std::sort(ns.begin(), ns.end());
  s.median_ms = Percentile(ns, 50) / 1e6;
  s.p90_ms = Percentile(ns, 90) / 1e6;
  return s;
}

// Median of log-derived times (ms after the kill) over the iterations that have them.
std::optional<double> MedianOf(const std::vector<Sample>& samples,
                               std::optional<double> RecoveryLogEvents::*field) {
  std::vector<double> v;
  for (const Sample& s : samples) {
    if ((s.log.*field).has_value()) v.push_back(*(s.log.*field));
  }
  if (v.empty()) return std::nullopt;
  std::sort(v.begin(), v.end());
  return v[(v.size() - 1) / 2];
}

std::string OptMs(std::optional<double> v) {
  return v.has_value() ? fmt::format("{:.0f}", *v) : std::string("n/a");
}
std::string OptJson(std::optional<double> v) {
  return v.has_value() ? fmt::format("{:.1f}", *v) : std::string("null");
}

client::Matrix RandomInput(uint32_t rows, uint32_t cols, uint32_t seed) {
  client::Matrix m;
  m.rows = rows;
  m.cols = cols;
  m.data.resize(static_cast<size_t>(rows) * cols);
  uint32_t x = seed * 2654435761u + 1;
  for (float& v : m.data) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    v = static_cast<float>(x >> 8) / static_cast<float>(1u << 24) - 0.5f;
  }
  return m;
}

class Recovery {
 public:
  explicit Recovery(RecoveryOptions options) : options_(std::move(options)) {}
  ~Recovery() { Cleanup(); }

  int Run() {
    Status s = RunAll();
    if (!s.ok()) {
      std::fprintf(stderr, "warmpool-bench --recovery: error: %s\n", s.ToString().c_str());
      Cleanup();
      return 1;
    }
    return 0;
  }

 private:
  Status RunAll() {
    if (options_.iterations == 0) return Error(Code::kInvalidArgument, "--iterations must be >= 1");
    if (options_.model_mib == 0) return Error(Code::kInvalidArgument, "--model-mib must be >= 1");
    if (options_.inflight == 0) return Error(Code::kInvalidArgument, "--inflight must be >= 1");
    if (options_.rows == 0) return Error(Code::kInvalidArgument, "--rows must be >= 1");

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

    // The model: written now, so the file is in the page cache for every load that follows.
    Result<DenseModelFile> file =
        WriteDenseModel(dir_ + "/mlp.safetensors", options_.model_mib << 20);
    if (!file.ok()) return file.status();
    model_ = *file;

    DaemonOptions daemon_options;
    daemon_options.binary = options_.daemon.empty() ? NextToSelf("warmpoold") : options_.daemon;
    daemon_options.directory = dir_;
    daemon_options.instance = fmt::format("bench-{}", getpid());
    daemon_options.backend = options_.backend;
    daemon_options.model = kModel;
    uint64_t budget = std::max<uint64_t>(4ull << 30, 4 * model_.weight_bytes + (1ull << 30));
    daemon_options.config_text = fmt::format(
        "# generated by warmpool-bench --recovery\n"
        "[daemon]\n"
        "workers_per_device = 2\n"
        "[pool]\n"
        "budget = {}\n"
        "[recovery]\n"
        "respawn_min_ms = {}\n"
        "respawn_max_ms = {}\n"
        "crash_loop_crashes = {}\n"
        "[[models]]\n"
        "name = \"{}\"\n"
        "engine = \"dense\"\n"
        "path = \"{}\"\n",
        budget, kRespawnMinMs, kRespawnMaxMs, kCrashLoopCrashes, kModel, model_.path);
    daemon_ = std::make_unique<Daemon>(daemon_options);
    if (Status s = daemon_->Spawn(); !s.ok()) return s;
    g_daemon_pid = daemon_->pid();
    if (Status s = daemon_->WaitReady(kStartupTimeoutMs); !s.ok()) return s;

    Result<std::unique_ptr<client::Client>> admin = Connect();
    if (!admin.ok()) return admin.status();
    admin_ = std::move(*admin);
    Result<std::unique_ptr<client::Client>> a = Connect();
    if (!a.ok()) return a.status();
    busy_ = std::move(*a);
    Result<std::unique_ptr<client::Client>> b = Connect();
    if (!b.ok()) return b.status();
    probe_ = std::move(*b);

    batch_input_ = RandomInput(options_.rows, model_.in_features, 1);
    probe_input_ = RandomInput(1, model_.in_features, 2);

    // First load (the file was just written: page cache), then steady-state inference times.
    if (Result<v1::LoadReply> r = admin_->Load(kModel); !r.ok()) return WithLog(r.status());
    if (Status s = Quiesce(); !s.ok()) return s;
    std::vector<uint64_t> batch_ns, probe_ns;
    for (uint32_t i = 0; i < std::max<uint32_t>(options_.iterations, 5); ++i) {
      auto t0 = Clock::now();
      if (Status s = CheckedInfer(*busy_, batch_input_); !s.ok()) return WithLog(s);
      auto t1 = Clock::now();
      if (Status s = CheckedInfer(*probe_, probe_input_); !s.ok()) return WithLog(s);
      batch_ns.push_back(Ns(t1 - t0));
      probe_ns.push_back(Ns(Clock::now() - t1));
    }
    batch_infer_ = SpreadOf(batch_ns);
    probe_infer_ = SpreadOf(probe_ns);

    // Baseline: warm loads from the page cache.
    std::vector<uint64_t> load_ns, load_reported_ns;
    for (uint32_t i = 0; i < options_.iterations; ++i) {
      if (Status s = admin_->Unload(kModel); !s.ok()) return WithLog(s);
      auto t0 = Clock::now();
      Result<v1::LoadReply> r = admin_->Load(kModel);
      auto t1 = Clock::now();
      if (!r.ok()) return WithLog(r.status());
      load_ns.push_back(Ns(t1 - t0));
      load_reported_ns.push_back(r->load_ms() * 1000000ull);
    }
    warm_load_ = SpreadOf(load_ns);
    warm_load_reported_ = SpreadOf(load_reported_ns);

    // The kills.
    for (uint32_t i = 0; i < options_.iterations; ++i) {
      if (Status s = Quiesce(); !s.ok()) return s;
      Result<Sample> sample = Iterate();
      if (!sample.ok()) return sample.status();
      samples_.push_back(std::move(*sample));
    }
    if (Status s = Quiesce(); !s.ok()) return s;

    admin_.reset();
    busy_.reset();
    probe_.reset();
    Status stopped = daemon_->Stop(kStopTimeoutMs);
    g_daemon_pid = -1;
    Report();
    if (!stopped.ok()) return stopped;
    RemoveDir();
    return OkStatus();
  }

  Result<std::unique_ptr<client::Client>> Connect() {
    Result<std::unique_ptr<client::Client>> c = client::Client::Connect(daemon_->socket_path());
    if (!c.ok()) return c.status();
    SetReceiveTimeout((*c)->fd());
    return c;
  }

  Status CheckedInfer(client::Client& c, const client::Matrix& input) {
    Result<client::Matrix> out = c.Infer(kModel, input);
    if (!out.ok()) return out.status();
    if (out->rows != input.rows || out->cols != model_.out_features) {
      return Error(Code::kInternal, "infer returned {} x {} for a {} x {} input", out->rows,
                   out->cols, input.rows, input.cols);
    }
    return OkStatus();
  }

  Status WithLog(const Status& s) {
    return Error(s.code(), "{}; warmpoold log:\n{}", s.ToString(), daemon_->LogTail());
  }

  // Until the daemon is idle: nothing in flight or queued, every worker up and idle, and the model
  // ready (the kill's reload and the killed worker's respawn are over).
  Status Quiesce() {
    auto deadline = Clock::now() + std::chrono::milliseconds(kQuiesceTimeoutMs);
    std::string last = "no status yet";
    for (;;) {
      Result<v1::StatusReply> st = admin_->GetStatus();
      if (!st.ok()) return WithLog(st.status());
      bool idle = st->inflight() == 0 && st->queued() == 0 && st->workers_size() == 2;
      for (const v1::WorkerStatus& w : st->workers()) idle = idle && w.state() == "idle";
      if (idle) {
        Result<v1::PsReply> ps = admin_->Ps();
        if (!ps.ok()) return WithLog(ps.status());
        for (const v1::PsEntry& e : ps->models()) {
          if (e.name() == kModel && e.state() == "ready" && e.worker() >= 0) return OkStatus();
          if (e.name() == kModel) last = fmt::format("model state {}", e.state());
        }
        if (ps->models_size() == 0) {
          // Not resident (an earlier step unloaded it): load it again.
          if (Result<v1::LoadReply> r = admin_->Load(kModel); !r.ok()) return WithLog(r.status());
          continue;
        }
      } else {
        last = fmt::format("inflight {}, queued {}, {} workers", st->inflight(), st->queued(),
                           st->workers_size());
        for (const v1::WorkerStatus& w : st->workers()) last += " " + w.state();
      }
      if (Clock::now() >= deadline) {
        return WithLog(Error(Code::kDeadlineExceeded, "warmpoold not quiescent within {} ms ({})",
                             kQuiesceTimeoutMs, last));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }

  // The worker holding the model: ps gives its slot, status that slot's pid.
  Result<std::pair<uint32_t, pid_t>> ModelWorker() {
    Result<v1::PsReply> ps = admin_->Ps();
    if (!ps.ok()) return ps.status();
    int32_t slot = -1;
    for (const v1::PsEntry& e : ps->models()) {
      if (e.name() == kModel) slot = e.worker();
    }
    if (slot < 0) return Error(Code::kFailedPrecondition, "model \"{}\" is on no worker", kModel);
    Result<v1::StatusReply> st = admin_->GetStatus();
    if (!st.ok()) return st.status();
    for (const v1::WorkerStatus& w : st->workers()) {
      if (static_cast<int32_t>(w.slot()) == slot && w.pid() > 0) {
        return std::make_pair(static_cast<uint32_t>(slot), static_cast<pid_t>(w.pid()));
      }
    }
    return Error(Code::kFailedPrecondition, "worker {} holding \"{}\" has no pid", slot, kModel);
  }

  Result<Sample> Iterate() {
    Sample sample;
    if (Result<v1::LoadReply> r = admin_->Load(kModel); !r.ok()) return WithLog(r.status());
    Result<std::pair<uint32_t, pid_t>> worker = ModelWorker();
    if (!worker.ok()) return WithLog(worker.status());
    auto [slot, pid] = *worker;
    uint64_t log_offset = LogSize(daemon_->log_path());

    const uint32_t k = options_.inflight;
    std::atomic<bool> sent{false};
    std::atomic<uint32_t> received{0};
    std::vector<Clock::time_point> reply_at(k);
    std::vector<bool> reply_ok(k, false);
    std::string busy_error;
    std::thread busy([&] {
      std::vector<uint64_t> ids;
      for (uint32_t i = 0; i < k; ++i) {
        Result<uint64_t> id = busy_->Send(MakeInferRequest(kModel, batch_input_, 0, false));
        if (!id.ok()) {
          busy_error = id.status().ToString();
          break;
        }
        ids.push_back(*id);
      }
      sent = true;
      for (size_t i = 0; i < ids.size(); ++i) {
        Result<v1::Envelope> reply = busy_->Receive();
        Clock::time_point at = Clock::now();
        if (!reply.ok()) {  // the connection failed: the rest will never come
          if (busy_error.empty()) busy_error = reply.status().ToString();
          break;
        }
        auto idx = std::find(ids.begin(), ids.end(), reply->request_id()) - ids.begin();
        if (idx >= static_cast<ptrdiff_t>(k)) continue;
        reply_at[idx] = at;
        Status s = client::StatusOf(*reply);
        if (s.ok() && !reply->has_infer_reply()) s = Error(Code::kInternal, "not an infer reply");
        if (s.ok()) {
          const v1::Tensor& t = reply->infer_reply().output();
          if (t.rows() != options_.rows || t.cols() != model_.out_features) {
            s = Error(Code::kInternal, "reply of {} x {}", t.rows(), t.cols());
          }
        }
        reply_ok[idx] = s.ok();
        if (!s.ok() && busy_error.empty()) busy_error = s.ToString();
        received++;
      }
    });

    std::latch go(1);
    Clock::time_point t0;
    std::optional<Clock::time_point> success_at;
    uint32_t probe_failures = 0;
    std::string probe_error;
    std::thread probe([&] {
      go.wait();
      while (Clock::now() - t0 < std::chrono::milliseconds(kProbeGiveUpMs)) {
        Status s = CheckedInfer(*probe_, probe_input_);
        if (s.ok()) {
          success_at = Clock::now();
          return;
        }
        probe_failures++;
        if (probe_error.empty()) probe_error = s.ToString();
        if (s.code() == Code::kUnavailable) return;  // the connection itself is gone
      }
    });

    // Until the K requests are on the worker (or some already came back), then a moment more so
    // that the worker is inside the first of them.
    while (!sent) std::this_thread::sleep_for(std::chrono::microseconds(50));
    auto wait_until = Clock::now() + std::chrono::seconds(2);
    while (Clock::now() < wait_until && received == 0) {
      Result<v1::StatusReply> st = admin_->GetStatus();
      if (!st.ok()) break;
      sample.inflight_at_kill = st->inflight();
      if (st->inflight() >= k) break;
    }
    uint64_t settle_ns = std::min<uint64_t>(batch_infer_.median_ms * 1e6 / 4, 25000000);
    std::this_thread::sleep_for(std::chrono::nanoseconds(settle_ns));

    auto t0_wall = std::chrono::system_clock::now();
    t0 = Clock::now();
    int killed = kill(pid, SIGKILL);
    int kill_errno = errno;
    go.count_down();
    busy.join();
    probe.join();
    if (killed != 0) {
      return Error(Code::kInternal, "kill({}, SIGKILL): {}", pid, std::strerror(kill_errno));
    }

    Clock::time_point last = t0;
    for (uint32_t i = 0; i < k; ++i) {
      if (reply_at[i] == Clock::time_point{}) {
        sample.failed++;  // never answered
        continue;
      }
      if (!reply_ok[i]) sample.failed++;
      if (reply_at[i] <= t0) {
        sample.answered_before_kill++;
      } else {
        sample.affected++;
        last = std::max(last, reply_at[i]);
      }
    }
    sample.all_answered_ns = Ns(last - t0);
    sample.first_error = busy_error;
    if (success_at.has_value()) {
      sample.first_success = true;
      sample.first_success_ns = Ns(*success_at - t0);
    }
    sample.probe_failures = probe_failures;
    if (sample.first_error.empty()) sample.first_error = probe_error;

    // The daemon's side of the story; its lines are written by the time everything is answered,
    // and the respawn by the time the daemon is quiescent.
    if (Status s = Quiesce(); !s.ok()) return s;
    sample.log = ParseRecoveryLog(ReadLogFrom(daemon_->log_path(), log_offset), t0_wall, slot,
                                  pid, kModel);
    return sample;
  }

  void Report() {
    std::vector<uint64_t> a_ns, b_ns;
    uint64_t affected = 0, failed = 0, before = 0, probe_failures = 0, not_busy = 0,
             no_success = 0, markers = 0;
    std::string first_error;
    for (const Sample& s : samples_) {
      if (s.affected > 0) a_ns.push_back(s.all_answered_ns);
      else not_busy++;
      if (s.first_success) b_ns.push_back(s.first_success_ns);
      else no_success++;
      affected += s.affected;
      failed += s.failed;
      before += s.answered_before_kill;
      probe_failures += s.probe_failures;
      markers += s.log.markers.value_or(0);
      if (first_error.empty()) first_error = s.first_error;
    }
    Spread a = SpreadOf(a_ns), b = SpreadOf(b_ns);
    double ratio = warm_load_.median_ms > 0 ? b.median_ms / warm_load_.median_ms : 0;
    bool a_met = a.count > 0 && a.median_ms < kTargetAllAnsweredMs;
    bool b_met = b.count > 0 && ratio <= kTargetFirstSuccessRatio;
    auto death = MedianOf(samples_, &RecoveryLogEvents::death_ms);
    auto reload_start = MedianOf(samples_, &RecoveryLogEvents::reload_start_ms);
    auto reload_done = MedianOf(samples_, &RecoveryLogEvents::reload_done_ms);
    auto reload_reported = MedianOf(samples_, &RecoveryLogEvents::reload_reported_ms);
    auto respawned = MedianOf(samples_, &RecoveryLogEvents::respawn_ms);
    uint64_t sent = static_cast<uint64_t>(options_.inflight) * samples_.size();
    std::string layers =
        fmt::format("{},{},{}", model_.in_features, model_.hidden, model_.out_features);
    double model_mib = model_.weight_bytes / 1048576.0;

    if (options_.json) {
      std::printf(
          "%s\n",
          fmt::format(
              "{{\"mode\": \"recovery\", \"model\": \"{}\", \"layers\": \"{}\", "
              "\"weight_bytes\": {}, \"workers\": 2, \"iterations\": {}, \"inflight\": {}, "
              "\"rows\": {}, \"respawn_min_ms\": {}, \"respawn_max_ms\": {}, "
              "\"crash_loop_crashes\": {}, "
              "\"warm_load_ms\": {{\"median\": {:.3f}, \"p90\": {:.3f}}}, "
              "\"warm_load_reported_ms\": {{\"median\": {:.1f}}}, "
              "\"infer_ms\": {{\"rows\": {}, \"median\": {:.3f}, \"p90\": {:.3f}}}, "
              "\"probe_infer_ms\": {{\"rows\": 1, \"median\": {:.3f}}}, "
              "\"all_answered_ms\": {{\"count\": {}, \"median\": {:.3f}, \"p90\": {:.3f}}}, "
              "\"first_success_ms\": {{\"count\": {}, \"median\": {:.3f}, \"p90\": {:.3f}}}, "
              "\"first_success_ratio\": {:.3f}, "
              "\"target_all_answered_ms\": {}, \"target_first_success_ratio\": {}, "
              "\"all_answered_target_met\": {}, \"first_success_target_met\": {}, "
              "\"requests_sent\": {}, \"requests_affected\": {}, \"requests_answered_before_kill\": "
              "{}, \"requests_failed\": {}, \"iterations_not_busy\": {}, "
              "\"probe_failures\": {}, \"iterations_without_success\": {}, "
              "\"inflight_markers_reclaimed\": {}, "
              "\"log_median_ms_after_kill\": {{\"death_handled\": {}, \"reload_started\": {}, "
              "\"reload_done\": {}, \"reload_reported\": {}, \"worker_respawned\": {}}}, "
              "\"first_error\": \"{}\"}}",
              kModel, layers, model_.weight_bytes, samples_.size(), options_.inflight,
              options_.rows, kRespawnMinMs, kRespawnMaxMs, kCrashLoopCrashes,
              warm_load_.median_ms, warm_load_.p90_ms, warm_load_reported_.median_ms,
              options_.rows, batch_infer_.median_ms, batch_infer_.p90_ms, probe_infer_.median_ms,
              a.count, a.median_ms, a.p90_ms, b.count, b.median_ms, b.p90_ms, ratio,
              kTargetAllAnsweredMs, kTargetFirstSuccessRatio, a_met, b_met, sent, affected,
              before, failed, not_busy, probe_failures, no_success, markers, OptJson(death),
              OptJson(reload_start), OptJson(reload_done), OptJson(reload_reported),
              OptJson(respawned), JsonEscape(first_error))
              .c_str());
      return;
    }
    std::string out = fmt::format(
        "warmpool-bench --recovery: SIGKILL of the worker running \"{}\" (dense {}, relu, "
        "{:.1f} MiB f32, random weights), 2 workers, backend {}\n"
        "{} iterations; per kill {} pipelined requests of {} rows on the worker, plus 1 new "
        "request (1 row) from a second connection right after the kill\n"
        "daemon config: [recovery] respawn_min_ms = {}, respawn_max_ms = {} (so respawn backoff "
        "does not dominate), crash_loop_crashes = {} (so repeated kills do not mark the model "
        "failed)\n\n",
        kModel, layers, model_mib, options_.backend, samples_.size(), options_.inflight,
        options_.rows, kRespawnMinMs, kRespawnMaxMs, kCrashLoopCrashes);
    out += fmt::format(
        "baseline: warm load from the page cache (unload, then load): median {:.2f} ms, p90 "
        "{:.2f} ms (daemon-reported load_ms median {:.0f})\n",
        warm_load_.median_ms, warm_load_.p90_ms, warm_load_reported_.median_ms);
    out += fmt::format(
        "steady state: infer of {} rows median {:.2f} ms, of 1 row median {:.2f} ms\n\n",
        options_.rows, batch_infer_.median_ms, probe_infer_.median_ms);
    out += fmt::format("{:<46} {:>10} {:>10}\n", "from SIGKILL", "median ms", "p90 ms");
    out += fmt::format("{:<46} {:>10.2f} {:>10.2f}\n", "(a) all affected requests answered",
                       a.median_ms, a.p90_ms);
    out += fmt::format("{:<46} {:>10.2f} {:>10.2f}\n", "(b) first success of a new request",
                       b.median_ms, b.p90_ms);
    out += fmt::format("{:<46} {:>10.2f} {:>10.2f}\n", "baseline: warm load from the page cache",
                       warm_load_.median_ms, warm_load_.p90_ms);
    out += fmt::format("\n(a) all affected requests answered: target < {} ms: {:.2f} ms, {}\n",
                       kTargetAllAnsweredMs, a.median_ms, a_met ? "met" : "NOT met");
    out += fmt::format(
        "(b) first success again: target within {}x of a warm load from the page cache: "
        "(b)/baseline = {:.2f}x, {}\n",
        kTargetFirstSuccessRatio, ratio, b_met ? "met" : "NOT met");
    out += fmt::format(
        "\nrequests: {} sent to the killed worker, {} answered after the kill (affected), {} "
        "before it; {} failed; {} in-flight markers reclaimed in all\n",
        sent, affected, before, failed, markers);
    out += fmt::format(
        "new requests: {} failed before the first success; {} iteration(s) without a success; {} "
        "iteration(s) where the worker had finished everything before the kill\n",
        probe_failures, no_success, not_busy);
    if (!first_error.empty()) out += fmt::format("first error: {}\n", first_error);
    out += fmt::format(
        "\nwhere the time goes (daemon log, 1 ms resolution, median ms after the kill):\n"
        "  death handled by the supervisor   {:>6}\n"
        "  reload started (other worker)     {:>6}\n"
        "  reload done                       {:>6}   (daemon-reported load {} ms)\n"
        "  (a) last affected reply           {:>6.0f}   (re-running {} x {} rows: {:.2f} ms each "
        "in steady state)\n"
        "  (b) first new request answered    {:>6.0f}\n"
        "  killed worker respawned           {:>6}\n",
        OptMs(death), OptMs(reload_start), OptMs(reload_done), OptMs(reload_reported),
        a.median_ms, options_.inflight, options_.rows, batch_infer_.median_ms, b.median_ms,
        OptMs(respawned));
    std::fputs(out.c_str(), stdout);
  }

  static std::string JsonEscape(const std::string& s) {
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

  void RemoveDir() {
    if (dir_.empty()) return;
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
    dir_.clear();
  }

  void Cleanup() {
    admin_.reset();
    busy_.reset();
    probe_.reset();
    if (daemon_ != nullptr && daemon_->pid() > 0) (void)daemon_->Stop(kStopTimeoutMs);
    g_daemon_pid = -1;
    daemon_.reset();
    RemoveDir();
  }

  RecoveryOptions options_;
  std::string dir_;
  DenseModelFile model_;
  std::unique_ptr<Daemon> daemon_;
  std::unique_ptr<client::Client> admin_, busy_, probe_;
  client::Matrix batch_input_, probe_input_;
  Spread batch_infer_, probe_infer_, warm_load_, warm_load_reported_;
  std::vector<Sample> samples_;
};

}  // namespace

int RunRecovery(const RecoveryOptions& options) { return Recovery(options).Run(); }

}  // namespace warmpool::bench
