// warmpool-bench --sharing: the first requests after a load and an attach, and the unpark against
// memcpy (steps 5 and 4 of sharing.h).
#include <cstring>
#include <string>
#include <vector>

#include "bench/session.h"
#include "bench/sharing_run.h"
#include "bench/stats.h"

namespace warmpool::bench {

using namespace probes;  // NOLINT: the measurements this mode is built from

// `count` 1-row requests sent at once on the inference connection; the time until all answered.
Result<uint64_t> Sharing::TimeInfers(const SizeResult& r, uint32_t count) {
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
Status Sharing::TimeFirstThenSteady(const SizeResult& r, uint32_t count, std::vector<uint64_t>& first,
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
Status Sharing::MeasureFirstRequests(SizeResult& r) {
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
Status Sharing::MeasureUnpark(SizeResult& r) {
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
}  // namespace warmpool::bench
