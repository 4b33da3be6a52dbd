// What the harness reads of the daemon once a scenario is over: the invariants every scenario must
// leave standing (an empty in-flight table, a valid index, no descriptor leaked, exactly the regions
// the models need, no orphan worker), and the segment's state to report when they do not hold.
#include <signal.h>

#include <set>
#include <string_view>

#include "chaos/harness.h"
#include "shm/inflight.h"
#include "shm/model_index.h"
#include "shm/segment.h"

namespace warmpool::chaos {

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

}  // namespace warmpool::chaos
