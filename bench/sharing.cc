#include "bench/sharing.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/skeleton.h"
#include "bench/model_file.h"
#include "bench/session.h"
#include "bench/sharing_probes.h"
#include "bench/stats.h"

namespace warmpool::bench {
namespace {

constexpr int kReplicaTimeoutMs = 10000;  // a replica not shown by ps this long after the request
constexpr uint32_t kWorkers = 4;
constexpr uint32_t kPipelined = 8;        // inferences sent at once per round of the PSS phase
constexpr uint32_t kMaxTouchRounds = 30;
constexpr double kTouchedFraction = 0.9;  // a worker whose Rss holds this much of the weights
constexpr double kTargetLoadRatio = 0.7;
constexpr double kTargetAttachMs = 1.0;
constexpr double kTargetPssRatio = 1.1;
constexpr double kTargetUnparkRatio = 0.7;
constexpr double kTargetFirstRatio = 1.5;
constexpr uint32_t kSteadyCalls = 3;      // steady requests timed after each first one


// ---- helpers ----

using namespace probes;  // NOLINT: the measurements this mode is built from

struct WorkerMemory {
  uint32_t slot = 0;
  pid_t pid = 0;
  MemoryUse before;  // right after the last attach, before any inference
  MemoryUse after;   // once every replica has served (touched the weights)
};

struct SizeResult {
  uint64_t size_mib = 0;
  std::string model;
  DenseModelFile file;
  uint64_t workspace_bytes = 0;  // per replica: ps bytes - weight_bytes with one replica
  uint64_t file_bytes = 0;
  uint32_t iterations = 0;
  // 1. cold load vs cat
  Spread cat, cat_empty, load, load_reported;
  double cat_gbps = 0, load_gbps = 0, load_ratio = 0;
  // cat less the median fork+exec+wait of an empty cat (the reading alone)
  double cat_read_ms = 0, cat_read_gbps = 0, load_ratio_read = 0;
  // 2. attach: index 0 = 1 -> 2, 1 = 2 -> 3, 2 = 3 -> 4
  Spread attach[kWorkers - 1], attach_reply[kWorkers - 1];
  Spread attach_all;
  uint64_t polls = 0;
  Spread poll_rtt;  // one ps round trip, measured while polling
  // 3. PSS
  std::vector<WorkerMemory> workers;
  MemoryUse supervisor;
  uint32_t touch_rounds = 0;
  bool all_touched = false;
  uint64_t pss_sum = 0, rss_sum = 0, pss_before_sum = 0, rss_before_sum = 0;
  uint64_t pss_shmem_sum = 0;  // Pss of shared memory: the weights' memfd (and the daemon's segment)
  uint64_t pss_idle_sum = 0;   // the same workers idle, before any model was loaded
  double pss_ratio = 0, rss_ratio = 0, pss_shmem_ratio = 0, pss_above_idle_ratio = 0;
  // 4. unpark (load of a parked model, replicas 1) vs memcpy of weight_bytes, in the same loop
  Spread unpark, unpark_reported, park;  // park: the `unload --park` call, for information
  Spread memcpy_fresh, memcpy_memfd, memcpy_reused;
  uint64_t unpark_log_lines = 0;  // 'unparking "NAME"' lines the daemon logged during the phase
  double unpark_gbps = 0, memcpy_fresh_gbps = 0, memcpy_memfd_gbps = 0, memcpy_reused_gbps = 0;
  double unpark_ratio_fresh = 0, unpark_ratio_memfd = 0, unpark_ratio_reused = 0;
  // 5. the first request after a load (one 1-row request) and after a replica's attach (two at
  // once, one for each replica), against the same requests once the replicas have served
  Spread first_after_load, steady_after_load, first_after_attach, steady_after_attach;
  double first_load_ratio = 0, first_attach_ratio = 0;
};

class Sharing {
 public:
  Sharing(SharingOptions options, BenchRun& run) : options_(std::move(options)), run_(run) {}

  static std::string ModelName(uint64_t mib) { return fmt::format("w{}mib", mib); }

  Status Run() {
    if (options_.iterations == 0) return Error(Code::kInvalidArgument, "--iterations must be >= 1");
    if (options_.sizes_mib.empty()) return Error(Code::kInvalidArgument, "--sizes-mib is empty");
    std::vector<uint64_t> sizes;
    for (uint64_t s : options_.sizes_mib) {
      if (s == 0) return Error(Code::kInvalidArgument, "--sizes-mib: sizes must be >= 1");
      if (std::find(sizes.begin(), sizes.end(), s) == sizes.end()) sizes.push_back(s);
    }
    if (access(kCat, X_OK) != 0) {
      return Error(Code::kFailedPrecondition, "{} is missing: the baseline needs it", kCat);
    }
    std::vector<std::string> files;
    for (uint64_t s : sizes) files.push_back(run_.File(ModelName(s) + ".safetensors"));

    // One daemon; each size's model is written, then registered (`warmpool register`), in turn.
    uint64_t largest = *std::max_element(sizes.begin(), sizes.end()) << 20;
    uint64_t budget = std::max<uint64_t>(8ull << 30, 2 * largest + (4ull << 30));
    uint64_t park_budget = 2 * largest;  // one parked copy of any size fits, twice over
    std::string config = fmt::format(
        "# generated by warmpool-bench --sharing\n"
        "[daemon]\n"
        "workers_per_device = {}\n"
        "[pool]\n"
        "budget = {}\n"
        "park_budget = {}\n",
        kWorkers, budget, park_budget);
    budget_ = budget;
    park_budget_ = park_budget;
    if (Status s = run_.StartDaemon(options_.daemon, options_.backend, config); !s.ok()) return s;

    Result<std::unique_ptr<client::Client>> admin = run_.Connect();
    if (!admin.ok()) return admin.status();
    admin_ = std::move(*admin);
    Result<std::unique_ptr<client::Client>> poller = run_.Connect();
    if (!poller.ok()) return poller.status();
    poller_ = std::move(*poller);
    Result<std::unique_ptr<client::Client>> infer = run_.Connect();
    if (!infer.ok()) return infer.status();
    infer_ = std::move(*infer);

    // The workers idle, before any model: their own Pss, to tell the weights from the processes.
    Result<v1::StatusReply> idle = admin_->GetStatus();
    if (!idle.ok()) return WithLog(idle.status());
    for (const v1::WorkerStatus& w : idle->workers()) {
      if (w.pid() <= 0) continue;
      if (Result<MemoryUse> use = ReadMemoryUse(static_cast<pid_t>(w.pid())); use.ok()) {
        idle_pss_[static_cast<pid_t>(w.pid())] = use->pss_bytes;
      }
    }

    for (size_t i = 0; i < sizes.size(); ++i) {
      Result<SizeResult> r = RunSize(sizes[i], files[i]);
      if (!r.ok()) return r.status();
      results_.push_back(std::move(*r));
    }

    admin_.reset();
    poller_.reset();
    infer_.reset();
    Status stopped = run_.StopDaemon();
    Report();
    return stopped;
  }

  Status WithLog(const Status& s) { return run_.WithLog(s); }

  Result<v1::LoadReply> Load(client::Client& c, const std::string& model, uint32_t replicas) {
    return c.Load(model, client::LoadOptions{replicas, std::nullopt});
  }

  // The model's ps entry (state, replicas), through the given connection.
  Result<v1::PsEntry> PsOf(client::Client& c, const std::string& model) {
    Result<v1::PsReply> ps = c.Ps();
    if (!ps.ok()) return ps.status();
    for (const v1::PsEntry& e : ps->models()) {
      if (e.name() == model) return e;
    }
    v1::PsEntry none;
    none.set_name(model);
    none.set_state("registered");
    return none;
  }

  // Polls ps on the poller connection until the model shows at least `replicas` replicas; returns
  // when it did (steady clock). Each poll's round trip goes to poll_rtt_ns_.
  Result<Clock::time_point> WaitReplicas(const std::string& model, uint32_t replicas) {
    auto deadline = Clock::now() + std::chrono::milliseconds(kReplicaTimeoutMs);
    for (;;) {
      auto t0 = Clock::now();
      Result<v1::PsEntry> e = PsOf(*poller_, model);
      auto t1 = Clock::now();
      if (!e.ok()) return e.status();
      poll_rtt_ns_.push_back(Ns(t1 - t0));
      polls_++;
      if (e->replicas() >= replicas) return t1;
      if (t1 >= deadline) {
        return WithLog(Error(Code::kDeadlineExceeded,
                             "\"{}\" still shows {} replica(s) (state {}) {} ms after asking for {}",
                             model, e->replicas(), e->state(), kReplicaTimeoutMs, replicas));
      }
      if (options_.poll_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(options_.poll_us));
    }
  }

  Status UnloadIfResident(const std::string& model) {
    Result<v1::PsEntry> e = PsOf(*admin_, model);
    if (!e.ok()) return e.status();
    if (e->state() == "registered") return OkStatus();
    if (Status s = admin_->Unload(model); !s.ok()) return WithLog(s);
    return OkStatus();
  }

  // UnloadRequest with park = true; the reply comes once the host copy is made (or, where the
  // worker could not make one, once the model was dropped instead: the caller checks ps).
  Status UnloadPark(const std::string& model) {
    if (Status s = admin_->Unload(model, /*park=*/true); !s.ok()) return WithLog(s);
    return OkStatus();
  }

  // `count` 1-row requests sent at once on the inference connection; the time until all answered.
  Result<uint64_t> TimeInfers(const SizeResult& r, uint32_t count) {
    client::Matrix input;
    input.rows = 1;
    input.cols = r.file.in_features;
    input.data.assign(input.cols, 0.25f);
    auto t0 = Clock::now();
    std::vector<uint64_t> ids;
    for (uint32_t k = 0; k < count; ++k) {
      Result<uint64_t> id = infer_->Send(MakeInferRequest(r.model, input, 0, false));
      if (!id.ok()) return WithLog(id.status());
      ids.push_back(*id);
    }
    for (uint64_t id : ids) {
      Result<v1::Envelope> reply = infer_->Wait(id);
      if (!reply.ok()) return WithLog(reply.status());
      if (Status s = client::StatusOf(*reply); !s.ok()) return WithLog(s);
    }
    return Ns(Clock::now() - t0);
  }

  // The first `count` requests (timed into `first`), then kSteadyCalls more (into `steady`).
  Status TimeFirstThenSteady(const SizeResult& r, uint32_t count, std::vector<uint64_t>& first,
                             std::vector<uint64_t>& steady) {
    for (uint32_t k = 0; k <= kSteadyCalls; ++k) {
      Result<uint64_t> ns = TimeInfers(r, count);
      if (!ns.ok()) return ns.status();
      (k == 0 ? first : steady).push_back(*ns);
    }
    return OkStatus();
  }

  // ---- 5. the first request after a load and after an attach, against steady ones ----
  // After a switch (unload, load from the page cache) one request; after the second replica
  // attached, two at once, which go one to each replica (the least loaded takes the next).
  Status MeasureFirstRequests(SizeResult& r) {
    std::vector<uint64_t> first_load, steady_load, first_attach, steady_attach;
    for (uint32_t i = 0; i < options_.iterations; ++i) {
      if (Status s = UnloadIfResident(r.model); !s.ok()) return s;
      if (Result<v1::LoadReply> l = Load(*admin_, r.model, 1); !l.ok()) return WithLog(l.status());
      if (Status s = TimeFirstThenSteady(r, 1, first_load, steady_load); !s.ok()) return s;
      if (Result<v1::LoadReply> l = Load(*admin_, r.model, 2); !l.ok()) return WithLog(l.status());
      if (Result<Clock::time_point> w = WaitReplicas(r.model, 2); !w.ok()) return w.status();
      if (Status s = TimeFirstThenSteady(r, 2, first_attach, steady_attach); !s.ok()) return s;
    }
    r.first_after_load = SpreadOf(first_load);
    r.steady_after_load = SpreadOf(steady_load);
    r.first_after_attach = SpreadOf(first_attach);
    r.steady_after_attach = SpreadOf(steady_attach);
    r.first_load_ratio = r.first_after_load.median_ms / std::max(1e-9, r.steady_after_load.median_ms);
    r.first_attach_ratio = r.first_after_attach.median_ms / std::max(1e-9, r.steady_after_attach.median_ms);
    return OkStatus();
  }

  // ---- 4. unpark (load of a parked model) vs memcpy of the weights, interleaved ----
  Status MeasureUnpark(SizeResult& r) {
    const uint64_t bytes = r.file.weight_bytes;
    if (bytes == 0) return Error(Code::kInternal, "\"{}\" has no weights to park", r.model);
    // Start from one replica (phase 3 left four).
    if (Status s = UnloadIfResident(r.model); !s.ok()) return s;
    // Baseline buffers: the source, faulted and filled once; the reused destination, faulted once.
    Mapping source, reused;
    {
      Result<void*> p = MapAnonymous(bytes);
      if (!p.ok()) return p.status();
      source.ptr = *p;
      source.bytes = bytes;
      std::memset(source.ptr, 0x5a, bytes);
      Result<void*> q = MapAnonymous(bytes);
      if (!q.ok()) return q.status();
      reused.ptr = *q;
      reused.bytes = bytes;
      std::memset(reused.ptr, 0, bytes);
    }
    (void)TimeMemcpyReused(reused.ptr, source.ptr, bytes);  // warm-up copy
    const std::string needle = fmt::format("unparking \"{}\"", r.model);
    const uint64_t lines_before = CountInFile(run_.daemon().spec().log, needle);
    std::vector<uint64_t> unpark_ns, reported_ns, park_ns, fresh_ns, memfd_ns, reused_ns;
    for (uint32_t i = 0; i < options_.iterations; ++i) {
      // Loaded with one replica (after the first iteration, the previous unpark left it so).
      if (Result<v1::LoadReply> l = Load(*admin_, r.model, 1); !l.ok()) return WithLog(l.status());
      auto p0 = Clock::now();
      if (Status s = UnloadPark(r.model); !s.ok()) return s;
      park_ns.push_back(Ns(Clock::now() - p0));
      Result<v1::PsEntry> e = PsOf(*admin_, r.model);
      if (!e.ok()) return e.status();
      if (e->state() != "parked") {
        return WithLog(Error(Code::kInternal,
                             "\"{}\" is {} after unload --park, not parked (park_budget {})",
                             r.model, e->state(), park_budget_));
      }
      auto t0 = Clock::now();
      Result<v1::LoadReply> l = Load(*admin_, r.model, 1);
      auto t1 = Clock::now();
      if (!l.ok()) return WithLog(l.status());
      if (l->already_loaded()) {
        return Error(Code::kInternal, "\"{}\" answered already_loaded while parked", r.model);
      }
      unpark_ns.push_back(Ns(t1 - t0));
      reported_ns.push_back(l->load_ms() * 1000000ull);

      Result<uint64_t> fresh = TimeMemcpyFresh(source.ptr, bytes);
      if (!fresh.ok()) return fresh.status();
      fresh_ns.push_back(*fresh);
      Result<uint64_t> memfd = TimeMemcpyMemfd(source.ptr, bytes);
      if (!memfd.ok()) return memfd.status();
      memfd_ns.push_back(*memfd);
      reused_ns.push_back(TimeMemcpyReused(reused.ptr, source.ptr, bytes));
    }
    r.unpark_log_lines = CountInFile(run_.daemon().spec().log, needle) - lines_before;
    if (r.unpark_log_lines < options_.iterations) {
      return WithLog(Error(Code::kInternal,
                           "the daemon logged '{}' {} time(s) for {} timed load(s) of the parked "
                           "model: not every load was an unpark",
                           needle, r.unpark_log_lines, options_.iterations));
    }
    r.unpark = SpreadOf(unpark_ns);
    r.unpark_reported = SpreadOf(reported_ns);
    r.park = SpreadOf(park_ns);
    r.memcpy_fresh = SpreadOf(fresh_ns);
    r.memcpy_memfd = SpreadOf(memfd_ns);
    r.memcpy_reused = SpreadOf(reused_ns);
    r.unpark_gbps = Throughput(bytes, r.unpark.median_ms);
    r.memcpy_fresh_gbps = Throughput(bytes, r.memcpy_fresh.median_ms);
    r.memcpy_memfd_gbps = Throughput(bytes, r.memcpy_memfd.median_ms);
    r.memcpy_reused_gbps = Throughput(bytes, r.memcpy_reused.median_ms);
    auto ratio = [&](double base) { return base > 0 ? r.unpark_gbps / base : 0; };
    r.unpark_ratio_fresh = ratio(r.memcpy_fresh_gbps);
    r.unpark_ratio_memfd = ratio(r.memcpy_memfd_gbps);
    r.unpark_ratio_reused = ratio(r.memcpy_reused_gbps);
    return OkStatus();
  }

  Result<SizeResult> RunSize(uint64_t size_mib, const std::string& path) {
    SizeResult r;
    r.size_mib = size_mib;
    r.model = ModelName(size_mib);
    r.iterations = options_.iterations;
    // The model: written now, so the file is in the page cache for what follows.
    uint32_t features = options_.features;
    if (features == 0) {  // in = out = hidden: 2 f^2 + 2 f floats
      features = static_cast<uint32_t>(std::max(1.0, std::round(std::sqrt((size_mib << 20) / 8.0))));
    }
    Result<DenseModelFile> file = WriteDenseModel(path, size_mib << 20, features, features);
    if (!file.ok()) return file.status();
    r.file = *file;
    if (Result<v1::RegisterReply> reg = admin_->Register(r.model, path, "dense"); !reg.ok()) {
      return WithLog(reg.status());
    }
    struct stat file_stat {};
    if (stat(path.c_str(), &file_stat) != 0) {
      return Error(Code::kInternal, "stat {}: {}", path, std::strerror(errno));
    }
    r.file_bytes = static_cast<uint64_t>(file_stat.st_size);

    // ---- 1. cold load (page cache warm) vs cat, interleaved per iteration ----
    if (Result<uint64_t> c = TimeCat(path); !c.ok()) return c.status();  // warm-up read
    {
      std::vector<uint64_t> empty_ns;
      for (uint32_t i = 0; i < options_.iterations; ++i) {
        Result<uint64_t> c = TimeCat("/dev/null");
        if (!c.ok()) return c.status();
        empty_ns.push_back(*c);
      }
      r.cat_empty = SpreadOf(empty_ns);
    }
    // A first load (not measured), so that every measured one follows an unload.
    if (Result<v1::LoadReply> l = Load(*admin_, r.model, 1); !l.ok()) return WithLog(l.status());
    std::vector<uint64_t> cat_ns, load_ns, reported_ns;
    for (uint32_t i = 0; i < options_.iterations; ++i) {
      Result<uint64_t> c = TimeCat(path);
      if (!c.ok()) return c.status();
      cat_ns.push_back(*c);
      if (Status s = UnloadIfResident(r.model); !s.ok()) return s;
      auto t0 = Clock::now();
      Result<v1::LoadReply> l = Load(*admin_, r.model, 1);
      auto t1 = Clock::now();
      if (!l.ok()) return WithLog(l.status());
      if (l->already_loaded()) {
        return Error(Code::kInternal, "\"{}\" was still loaded after its unload", r.model);
      }
      load_ns.push_back(Ns(t1 - t0));
      reported_ns.push_back(l->load_ms() * 1000000ull);
    }
    r.cat = SpreadOf(cat_ns);
    r.load = SpreadOf(load_ns);
    r.load_reported = SpreadOf(reported_ns);
    r.cat_gbps = Throughput(r.file_bytes, r.cat.median_ms);
    r.load_gbps = Throughput(r.file_bytes, r.load.median_ms);
    r.load_ratio = r.cat_gbps > 0 ? r.load_gbps / r.cat_gbps : 0;
    r.cat_read_ms = std::max(0.0, r.cat.median_ms - r.cat_empty.median_ms);
    r.cat_read_gbps = Throughput(r.file_bytes, r.cat_read_ms);
    r.load_ratio_read = r.cat_read_gbps > 0 ? r.load_gbps / r.cat_read_gbps : 0;
    {
      Result<v1::PsEntry> e = PsOf(*admin_, r.model);
      if (!e.ok()) return e.status();
      r.workspace_bytes = e->bytes() > e->weight_bytes() ? e->bytes() - e->weight_bytes() : 0;
    }

    // ---- 2. replica attach: 1 -> 2 -> 3 -> 4, from a fresh single-replica load each time ----
    polls_ = 0;
    poll_rtt_ns_.clear();
    std::vector<uint64_t> attach_ns[kWorkers - 1], reply_ns[kWorkers - 1], all_ns;
    for (uint32_t i = 0; i < options_.iterations; ++i) {
      if (Status s = UnloadIfResident(r.model); !s.ok()) return s;
      if (Result<v1::LoadReply> l = Load(*admin_, r.model, 1); !l.ok()) return WithLog(l.status());
      if (Result<Clock::time_point> w = WaitReplicas(r.model, 1); !w.ok()) return w.status();
      for (uint32_t n = 2; n <= kWorkers; ++n) {
        auto t0 = Clock::now();
        Result<v1::LoadReply> l = Load(*admin_, r.model, n);
        auto t_reply = Clock::now();
        if (!l.ok()) return WithLog(l.status());
        Result<Clock::time_point> shown = WaitReplicas(r.model, n);
        if (!shown.ok()) return shown.status();
        attach_ns[n - 2].push_back(Ns(*shown - t0));
        reply_ns[n - 2].push_back(Ns(t_reply - t0));
        all_ns.push_back(Ns(*shown - t0));
      }
    }
    for (uint32_t k = 0; k + 1 < kWorkers; ++k) {
      r.attach[k] = SpreadOf(attach_ns[k]);
      r.attach_reply[k] = SpreadOf(reply_ns[k]);
    }
    r.attach_all = SpreadOf(all_ns);
    r.polls = polls_;
    r.poll_rtt = SpreadOf(poll_rtt_ns_);

    // ---- 3. PSS of the four replicas once each has served (touched the weights) ----
    Result<v1::StatusReply> st = admin_->GetStatus();
    if (!st.ok()) return WithLog(st.status());
    for (const v1::WorkerStatus& w : st->workers()) {
      if (w.pid() <= 0) continue;
      WorkerMemory m;
      m.slot = w.slot();
      m.pid = static_cast<pid_t>(w.pid());
      Result<MemoryUse> use = ReadMemoryUse(m.pid);
      if (!use.ok()) return use.status();
      m.before = *use;
      r.workers.push_back(m);
    }
    if (r.workers.size() != kWorkers) {
      return WithLog(Error(Code::kInternal, "status shows {} live workers, expected {}",
                           r.workers.size(), kWorkers));
    }
    client::Matrix input;
    input.rows = 1;
    input.cols = r.file.in_features;
    input.data.assign(input.cols, 0.25f);
    const uint64_t touched_bytes = static_cast<uint64_t>(r.file.weight_bytes * kTouchedFraction);
    for (r.touch_rounds = 1; r.touch_rounds <= kMaxTouchRounds; ++r.touch_rounds) {
      std::vector<uint64_t> ids;
      for (uint32_t k = 0; k < kPipelined; ++k) {
        Result<uint64_t> id = infer_->Send(MakeInferRequest(r.model, input, 0, false));
        if (!id.ok()) return WithLog(id.status());
        ids.push_back(*id);
      }
      for (uint64_t id : ids) {
        Result<v1::Envelope> reply = infer_->Wait(id);
        if (!reply.ok()) return WithLog(reply.status());
        if (Status s = client::StatusOf(*reply); !s.ok()) return WithLog(s);
      }
      bool all = true;
      for (WorkerMemory& m : r.workers) {
        Result<MemoryUse> use = ReadMemoryUse(m.pid);
        if (!use.ok()) return use.status();
        m.after = *use;
        if (m.after.rss_bytes < touched_bytes) all = false;
      }
      if (all) {
        r.all_touched = true;
        break;
      }
    }
    r.touch_rounds = std::min(r.touch_rounds, kMaxTouchRounds);
    for (const WorkerMemory& m : r.workers) {
      r.pss_sum += m.after.pss_bytes;
      r.rss_sum += m.after.rss_bytes;
      r.pss_before_sum += m.before.pss_bytes;
      r.rss_before_sum += m.before.rss_bytes;
      r.pss_shmem_sum += m.after.pss_shmem_bytes;
      if (auto it = idle_pss_.find(m.pid); it != idle_pss_.end()) r.pss_idle_sum += it->second;
    }
    if (Result<MemoryUse> sup = ReadMemoryUse(run_.daemon().pid()); sup.ok()) r.supervisor = *sup;
    r.pss_ratio = static_cast<double>(r.pss_sum) / r.file_bytes;
    r.rss_ratio = static_cast<double>(r.rss_sum) / r.file_bytes;
    r.pss_shmem_ratio = static_cast<double>(r.pss_shmem_sum) / r.file_bytes;
    r.pss_above_idle_ratio =
        static_cast<double>(r.pss_sum - std::min(r.pss_sum, r.pss_idle_sum)) / r.file_bytes;

    if (Status s = MeasureFirstRequests(r); !s.ok()) return s;
    if (Status s = MeasureUnpark(r); !s.ok()) return s;

    // Room for the next size: let the weights and the file go.
    if (Status s = UnloadIfResident(r.model); !s.ok()) return s;
    std::error_code ec;
    std::filesystem::remove(path, ec);
    return r;
  }

  void Report() {
    if (options_.json) {
      std::string sizes;
      for (const SizeResult& r : results_) {
        if (!sizes.empty()) sizes += ", ";
        std::string attach;
        for (uint32_t k = 0; k + 1 < kWorkers; ++k) {
          if (!attach.empty()) attach += ", ";
          attach += fmt::format("{{\"from\": {}, \"to\": {}, \"until_ps_shows\": {}, \"reply\": {}}}",
                                k + 1, k + 2, SpreadJson(r.attach[k]), SpreadJson(r.attach_reply[k]));
        }
        std::string unpark = fmt::format(
            "{{\"bytes\": {}, \"unpark\": {}, \"unpark_reported\": {}, \"park\": {}, "
            "\"memcpy_fresh\": {}, \"memcpy_fresh_memfd\": {}, \"memcpy_reused\": {}, "
            "\"unpark_gb_per_s\": {:.3f}, \"memcpy_fresh_gb_per_s\": {:.3f}, "
            "\"memcpy_fresh_memfd_gb_per_s\": {:.3f}, \"memcpy_reused_gb_per_s\": {:.3f}, "
            "\"ratio_vs_fresh\": {:.3f}, \"ratio_vs_fresh_memfd\": {:.3f}, "
            "\"ratio_vs_reused\": {:.3f}, \"unparking_log_lines\": {}, \"target\": {}, "
            "\"target_met\": {}}}",
            r.file.weight_bytes, SpreadJson(r.unpark), SpreadJson(r.unpark_reported),
            SpreadJson(r.park), SpreadJson(r.memcpy_fresh), SpreadJson(r.memcpy_memfd),
            SpreadJson(r.memcpy_reused), r.unpark_gbps, r.memcpy_fresh_gbps, r.memcpy_memfd_gbps,
            r.memcpy_reused_gbps, r.unpark_ratio_fresh, r.unpark_ratio_memfd,
            r.unpark_ratio_reused, r.unpark_log_lines, kTargetUnparkRatio,
            r.unpark_ratio_reused >= kTargetUnparkRatio);
        std::string first = fmt::format(
            "{{\"after_load\": {}, \"steady_after_load\": {}, \"after_attach\": {}, "
            "\"steady_after_attach\": {}, \"ratio_after_load\": {:.3f}, \"ratio_after_attach\": {:.3f}, "
            "\"target\": {}, \"target_met\": {}}}",
            SpreadJson(r.first_after_load), SpreadJson(r.steady_after_load), SpreadJson(r.first_after_attach),
            SpreadJson(r.steady_after_attach), r.first_load_ratio, r.first_attach_ratio, kTargetFirstRatio,
            r.first_load_ratio <= kTargetFirstRatio && r.first_attach_ratio <= kTargetFirstRatio);
        std::string workers;
        for (const WorkerMemory& m : r.workers) {
          if (!workers.empty()) workers += ", ";
          workers += fmt::format(
              "{{\"slot\": {}, \"pid\": {}, \"pss_bytes\": {}, \"rss_bytes\": {}, "
              "\"pss_shmem_bytes\": {}, \"pss_bytes_before_infer\": {}, "
              "\"rss_bytes_before_infer\": {}}}",
              m.slot, m.pid, m.after.pss_bytes, m.after.rss_bytes, m.after.pss_shmem_bytes,
              m.before.pss_bytes, m.before.rss_bytes);
        }
        sizes += fmt::format(
            "{{\"size_mib\": {}, \"model\": \"{}\", \"layers\": \"{},{},{}\", \"file_bytes\": {}, "
            "\"weight_bytes\": {}, \"workspace_bytes_per_replica\": {}, \"iterations\": {}, "
            "\"cold_load\": {{\"cat\": {}, \"cat_empty_file\": {}, \"load\": {}, "
            "\"load_reported\": {}, \"cat_gb_per_s\": {:.3f}, \"load_gb_per_s\": {:.3f}, "
            "\"ratio\": {:.3f}, \"cat_read_only_ms\": {:.4f}, \"ratio_vs_read_only\": {:.3f}, "
            "\"target\": {}, \"target_met\": {}}}, "
            "\"attach\": {{\"steps\": [{}], \"all\": {}, \"polls\": {}, \"poll_sleep_us\": {}, "
            "\"poll_round_trip\": {}, \"target_ms\": {}, \"target_met\": {}}}, "
            "\"pss\": {{\"replicas\": {}, \"touch_rounds\": {}, \"requests_per_round\": {}, "
            "\"all_touched\": {}, \"workers\": [{}], \"pss_sum_bytes\": {}, \"rss_sum_bytes\": {}, "
            "\"pss_sum_before_infer_bytes\": {}, \"rss_sum_before_infer_bytes\": {}, "
            "\"pss_shmem_sum_bytes\": {}, \"pss_sum_idle_workers_bytes\": {}, "
            "\"supervisor_pss_bytes\": {}, \"supervisor_rss_bytes\": {}, \"pss_ratio\": {:.3f}, "
            "\"rss_ratio\": {:.3f}, \"pss_shmem_ratio\": {:.3f}, \"pss_above_idle_ratio\": {:.3f}, "
            "\"target\": {}, \"target_met\": {}}}, \"unpark\": {}, \"first_request\": {}}}",
            r.size_mib, r.model, r.file.in_features, r.file.hidden, r.file.out_features,
            r.file_bytes, r.file.weight_bytes, r.workspace_bytes, r.iterations, SpreadJson(r.cat),
            SpreadJson(r.cat_empty), SpreadJson(r.load), SpreadJson(r.load_reported), r.cat_gbps,
            r.load_gbps, r.load_ratio, r.cat_read_ms, r.load_ratio_read, kTargetLoadRatio, r.load_ratio >= kTargetLoadRatio, attach,
            SpreadJson(r.attach_all), r.polls, options_.poll_us, SpreadJson(r.poll_rtt),
            kTargetAttachMs, r.attach_all.median_ms < kTargetAttachMs, kWorkers, r.touch_rounds,
            kPipelined, r.all_touched, workers, r.pss_sum, r.rss_sum, r.pss_before_sum,
            r.rss_before_sum, r.pss_shmem_sum, r.pss_idle_sum, r.supervisor.pss_bytes,
            r.supervisor.rss_bytes, r.pss_ratio, r.rss_ratio, r.pss_shmem_ratio,
            r.pss_above_idle_ratio, kTargetPssRatio, r.pss_ratio <= kTargetPssRatio, unpark, first);
      }
      std::printf("%s\n",
                  fmt::format("{{\"mode\": \"sharing\", \"backend\": \"{}\", \"workers\": {}, "
                              "\"budget_bytes\": {}, \"park_budget_bytes\": {}, "
                              "\"attach_measured_by\": \"ps polling\", \"sizes\": [{}]}}",
                              JsonEscape(options_.backend), kWorkers, budget_, park_budget_, sizes)
                      .c_str());
      return;
    }

    std::string out = fmt::format(
        "warmpool-bench --sharing: dense f32 models (random weights) served by {} workers, backend "
        "{}, [pool] budget {:.1f} GiB, park_budget {:.1f} GiB; {} iteration(s) per size\n",
        kWorkers, options_.backend, budget_ / 1073741824.0, park_budget_ / 1073741824.0,
        options_.iterations);
    for (const SizeResult& r : results_) {
      out += fmt::format(
          "\n=== {} MiB: \"{}\" (dense {},{},{}), file {} bytes ({:.1f} MiB), weights {} bytes, "
          "workspace {:.1f} MiB per replica ===\n",
          r.size_mib, r.model, r.file.in_features, r.file.hidden, r.file.out_features,
          r.file_bytes, MiB(r.file_bytes), r.file.weight_bytes, MiB(r.workspace_bytes));
      out += fmt::format(
          "1. cold load from the page cache vs cat (interleaved, {} each)\n"
          "   {:<44} {:>10} {:>10} {:>10}\n",
          r.iterations, "", "median ms", "p90 ms", "GB/s");
      out += fmt::format("   {:<44} {:>10.3f} {:>10.3f} {:>10.2f}\n",
                         "cat FILE > /dev/null (fork+exec /bin/cat)", r.cat.median_ms,
                         r.cat.p90_ms, r.cat_gbps);
      out += fmt::format("   {:<44} {:>10.3f} {:>10.3f} {:>10.2f}\n",
                         "unload, then load (load timed, replicas 1)", r.load.median_ms,
                         r.load.p90_ms, r.load_gbps);
      out += fmt::format(
          "   (cat of an empty file, i.e. fork+exec+wait alone: median {:.3f} ms; daemon-reported "
          "load_ms median {:.0f})\n",
          r.cat_empty.median_ms, r.load_reported.median_ms);
      out += fmt::format(
          "   throughput ratio load/cat {:.2f}x (target >= {}x): {}   [against cat less its "
          "fork+exec ({:.3f} ms, {:.2f} GB/s): {:.2f}x]\n",
          r.load_ratio, kTargetLoadRatio, r.load_ratio >= kTargetLoadRatio ? "met" : "NOT met",
          r.cat_read_ms, r.cat_read_gbps, r.load_ratio_read);

      out += fmt::format(
          "2. replica attach: LoadRequest replicas=N -> ps shows N (ps polled: {} us sleep + one "
          "ps round trip, median {:.1f} us, so ~{:.0f} us granularity; {} polls)\n"
          "   {:<44} {:>10} {:>10} {:>10}\n",
          options_.poll_us, r.poll_rtt.median_ms * 1e3,
          options_.poll_us + r.poll_rtt.median_ms * 1e3, r.polls, "", "median ms", "p90 ms",
          "reply ms");
      for (uint32_t k = 0; k + 1 < kWorkers; ++k) {
        out += fmt::format("   {:<44} {:>10.3f} {:>10.3f} {:>10.3f}\n",
                           fmt::format("{} -> {} replicas", k + 1, k + 2), r.attach[k].median_ms,
                           r.attach[k].p90_ms, r.attach_reply[k].median_ms);
      }
      out += fmt::format("   {:<44} {:>10.3f} {:>10.3f}\n", "all attaches", r.attach_all.median_ms,
                         r.attach_all.p90_ms);
      out += fmt::format("   attach median {:.3f} ms (target < {} ms): {}\n",
                         r.attach_all.median_ms, kTargetAttachMs,
                         r.attach_all.median_ms < kTargetAttachMs ? "met" : "NOT met");

      out += fmt::format(
          "3. memory with {} replicas, after {} round(s) of {} pipelined 1-row inferences ({})\n"
          "   {:<8} {:>8} {:>12} {:>12} {:>12} {:>14} {:>14}\n",
          kWorkers, r.touch_rounds, kPipelined,
          r.all_touched ? "every worker's Rss holds the weights: all touched them"
                        : "NOT every worker touched the weights",
          "slot", "pid", "Pss MiB", "Pss_Shmem", "Rss MiB", "Pss MiB before", "Rss MiB before");
      for (const WorkerMemory& m : r.workers) {
        out += fmt::format("   {:<8} {:>8} {:>12.1f} {:>12.1f} {:>12.1f} {:>14.1f} {:>14.1f}\n",
                           m.slot, m.pid, MiB(m.after.pss_bytes), MiB(m.after.pss_shmem_bytes),
                           MiB(m.after.rss_bytes), MiB(m.before.pss_bytes),
                           MiB(m.before.rss_bytes));
      }
      out += fmt::format("   {:<8} {:>8} {:>12.1f} {:>12} {:>12.1f} {:>14.1f} {:>14.1f}\n", "sum",
                         "", MiB(r.pss_sum), "", MiB(r.rss_sum), MiB(r.pss_before_sum),
                         MiB(r.rss_before_sum));
      out += fmt::format(
          "   (\"before\": right after the last attach, before any inference; supervisor, which "
          "holds the memfd: Pss {:.1f} MiB, Rss {:.1f} MiB)\n",
          MiB(r.supervisor.pss_bytes), MiB(r.supervisor.rss_bytes));
      out += fmt::format(
          "   sum of Pss / one copy (file size) {:.3f}x (target <= {}x): {}; sum of Rss {:.2f}x\n"
          "   of which shared (sum of Pss_Shmem: the weights' memfd) {:.3f}x; sum of Pss above the "
          "same workers idle before any model ({:.1f} MiB) {:.3f}x\n",
          r.pss_ratio, kTargetPssRatio, r.pss_ratio <= kTargetPssRatio ? "met" : "NOT met",
          r.rss_ratio, r.pss_shmem_ratio, MiB(r.pss_idle_sum), r.pss_above_idle_ratio);

      out += fmt::format(
          "4. unpark vs memcpy of the weights ({} bytes, {:.1f} MiB; interleaved, {} each; "
          "'unparking \"{}\"' logged {} time(s))\n"
          "   {:<44} {:>10} {:>10} {:>10}\n",
          r.file.weight_bytes, MiB(r.file.weight_bytes), r.iterations, r.model,
          r.unpark_log_lines, "", "median ms", "p90 ms", "GB/s");
      out += fmt::format("   {:<44} {:>10.3f} {:>10.3f} {:>10.2f}\n",
                         "unload --park, then load (load timed)", r.unpark.median_ms,
                         r.unpark.p90_ms, r.unpark_gbps);
      out += fmt::format("   {:<44} {:>10.3f} {:>10.3f} {:>10.2f}\n",
                         "memcpy into a fresh buffer (mmap, no memset)", r.memcpy_fresh.median_ms,
                         r.memcpy_fresh.p90_ms, r.memcpy_fresh_gbps);
      out += fmt::format("   {:<44} {:>10.3f} {:>10.3f} {:>10.2f}\n",
                         "memcpy into a fresh memfd region", r.memcpy_memfd.median_ms,
                         r.memcpy_memfd.p90_ms, r.memcpy_memfd_gbps);
      out += fmt::format("   {:<44} {:>10.3f} {:>10.3f} {:>10.2f}\n",
                         "memcpy into a reused, faulted buffer", r.memcpy_reused.median_ms,
                         r.memcpy_reused.p90_ms, r.memcpy_reused_gbps);
      out += fmt::format(
          "   (the unload --park call itself: median {:.3f} ms; daemon-reported load_ms of the "
          "unpark median {:.0f})\n",
          r.park.median_ms, r.unpark_reported.median_ms);
      out += fmt::format(
          "   throughput ratio unpark/memcpy(reused) {:.2f}x (target >= {}x): {}   [vs fresh buffer "
          "{:.2f}x; vs fresh memfd {:.2f}x]\n",
          r.unpark_ratio_reused, kTargetUnparkRatio,
          r.unpark_ratio_reused >= kTargetUnparkRatio ? "met" : "NOT met", r.unpark_ratio_fresh,
          r.unpark_ratio_memfd);
      out += fmt::format(
          "5. the first request after a switch (unload, load; 1 row) and after a second replica's "
          "attach (2 rows at once, one per replica), against the {} that follow each ({} each)\n"
          "   {:<44} {:>10} {:>10} {:>10} {:>8}\n",
          kSteadyCalls, r.iterations, "", "first ms", "steady ms", "ratio", "target");
      out += fmt::format("   {:<44} {:>10.3f} {:>10.3f} {:>9.2f}x {:>7}x\n", "after a load", r.first_after_load.median_ms,
                         r.steady_after_load.median_ms, r.first_load_ratio, kTargetFirstRatio);
      out += fmt::format("   {:<44} {:>10.3f} {:>10.3f} {:>9.2f}x {:>7}x\n", "after an attach",
                         r.first_after_attach.median_ms, r.steady_after_attach.median_ms, r.first_attach_ratio,
                         kTargetFirstRatio);
    }

    out += fmt::format("\n{:<10} {:>12} {:>14} {:>14} {:>14} {:>14} {:>14} {:>12} {:>12}\n", "size",
                       "load/cat", "attach med ms", "attach p90 ms", "Pss/1 copy",
                       "unpark/fresh", "unpark/reused", "1st/load", "1st/attach");
    for (const SizeResult& r : results_) {
      out += fmt::format("{:<10} {:>11.2f}x {:>14.3f} {:>14.3f} {:>13.3f}x {:>13.2f}x {:>13.2f}x {:>11.2f}x {:>11.2f}x\n",
                         fmt::format("{} MiB", r.size_mib), r.load_ratio, r.attach_all.median_ms,
                         r.attach_all.p90_ms, r.pss_ratio, r.unpark_ratio_fresh,
                         r.unpark_ratio_reused, r.first_load_ratio, r.first_attach_ratio);
    }
    out += fmt::format("{:<10} {:>11}x {:>14} {:>14} {:>13}x {:>14} {:>13}x {:>11}x {:>11}x\n", "target",
                       ">= 0.7", "< 1", "", "<= 1.1", "", ">= 0.7", "<= 1.5", "<= 1.5");
    out +=
        "attach time: from sending the LoadRequest to the first ps reply showing the new count "
        "(daemon log stamps have 1 ms resolution, too coarse for a sub-millisecond target)\n"
        "unpark/reused: throughput of a timed load of a parked model (request to reply) against "
        "memcpy of the same bytes into a buffer mapped and faulted before\n"
        "1st/load, 1st/attach: the first request on a model just loaded, and on a replica just "
        "attached, against steady requests\n";
    std::fputs(out.c_str(), stdout);
  }

  SharingOptions options_;
  BenchRun& run_;
  uint64_t budget_ = 0;
  uint64_t park_budget_ = 0;
  std::unique_ptr<client::Client> admin_, poller_, infer_;
  std::vector<SizeResult> results_;
  uint64_t polls_ = 0;
  std::vector<uint64_t> poll_rtt_ns_;
  std::map<pid_t, uint64_t> idle_pss_;
};

}  // namespace

int RunSharing(const SharingOptions& options) {
  return BenchRun::Main(" --sharing", [&](BenchRun& run) { return Sharing(options, run).Run(); });
}

}  // namespace warmpool::bench
