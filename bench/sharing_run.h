// warmpool-bench --sharing's run (sharing.h says what it measures): the daemon, each size's model
// and the steps of sharing.cc, the first requests and the unpark of sharing_measure.cc.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "bench/sharing.h"
#include "bench/sharing_probes.h"
#include "bench/sharing_result.h"
#include "bench/skeleton.h"
#include "client/client.h"

namespace warmpool::bench {

class Sharing {
 public:
  Sharing(SharingOptions options, BenchRun& run) : options_(std::move(options)), run_(run) {}

  // Every size in turn on one daemon, then the report.
  Status Run();

 private:
  static constexpr int kReplicaTimeoutMs = 10000;  // a replica not shown by ps this long after the request
  static constexpr uint32_t kWorkers = kSharingWorkers;
  static constexpr uint32_t kMaxTouchRounds = 30;
  static constexpr double kTouchedFraction = 0.9;  // a worker whose Rss holds this much of the weights

  static std::string ModelName(uint64_t mib) { return fmt::format("w{}mib", mib); }

  Status WithLog(const Status& s) { return run_.WithLog(s); }

  Result<v1::LoadReply> Load(client::Client& c, const std::string& model, uint32_t replicas);

  // The model's ps entry (state, replicas), through the given connection.
  Result<v1::PsEntry> PsOf(client::Client& c, const std::string& model);

  // Polls ps on the poller connection until the model shows at least `replicas` replicas; returns
  // when it did (steady clock). Each poll's round trip goes to poll_rtt_ns_.
  Result<probes::Clock::time_point> WaitReplicas(const std::string& model, uint32_t replicas);

  Status UnloadIfResident(const std::string& model);

  // UnloadRequest with park = true; the reply comes once the host copy is made (or, where the
  // worker could not make one, once the model was dropped instead: the caller checks ps).
  Status UnloadPark(const std::string& model);

  // `count` 1-row requests sent at once on the inference connection; the time until all answered.
  Result<uint64_t> TimeInfers(const SizeResult& r, uint32_t count);

  // The first `count` requests (timed into `first`), then kSteadyCalls more (into `steady`).
  Status TimeFirstThenSteady(const SizeResult& r, uint32_t count, std::vector<uint64_t>& first,
                             std::vector<uint64_t>& steady);

  // ---- 5. the first request after a load and after an attach, against steady ones ----
  // After a switch (unload, load from the page cache) one request; after the second replica
  // attached, two at once, which go one to each replica (the least loaded takes the next).
  Status MeasureFirstRequests(SizeResult& r);

  // ---- 4. unpark (load of a parked model) vs memcpy of the weights, interleaved ----
  Status MeasureUnpark(SizeResult& r);

  // Steps 1 to 5 for one size: its model written, registered, measured, then unloaded and removed.
  Result<SizeResult> RunSize(uint64_t size_mib, const std::string& path);

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

}  // namespace warmpool::bench
