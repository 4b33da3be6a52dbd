#include "top/top_sample.h"

#include <fmt/format.h>

#include <atomic>
#include <cstring>

#include "common/clock.h"
#include "shm/model_index.h"
#include "shm/seqlock.h"

namespace warmpool::top {

namespace {

// A live supervisor holds a record's seqlock for microseconds; only one killed mid-write keeps it
// odd, and then the record is skipped rather than waited for.
constexpr int kSeqTries = 1 << 16;
// See SampleSegment.
constexpr int kBatchTries = 8;

std::string Bounded(const char* text, size_t size) {
  return std::string(text, strnlen(text, size));
}

uint64_t LoadChanges(const shm::SegmentHeader& header) {
  return std::atomic_ref<uint64_t>(const_cast<uint64_t&>(header.changes))
      .load(std::memory_order_acquire);
}

shm::PoolStats CopyPoolStats(const shm::PoolStats& live) {
  shm::PoolStats copy{};
  for (uint32_t r = 0; r < static_cast<uint32_t>(shm::RestartReason::kCount); r++) {
    copy.restarts[r] = shm::StatLoad(live.restarts[r]);
  }
  copy.queued = shm::StatLoad(live.queued);
  copy.inflight = shm::StatLoad(live.inflight);
  copy.started_unix_ns = shm::StatLoad(live.started_unix_ns);
  return copy;
}

shm::ModelStats LoadModelStatsOnce(const shm::ModelStats& live) {
  shm::ModelStats copy{};
  copy.generation = shm::StatLoad(live.generation);
  for (uint32_t k = 0; k < static_cast<uint32_t>(shm::RequestKind::kCount); k++) {
    for (uint32_t c = 0; c < shm::kCodes; c++)
      copy.requests[k][c] = shm::StatLoad(live.requests[k][c]);
  }
  for (uint32_t s = 0; s < static_cast<uint32_t>(shm::LoadSource::kCount); s++) {
    copy.loads[s] = shm::StatLoad(live.loads[s]);
  }
  for (uint32_t r = 0; r < static_cast<uint32_t>(shm::ReleaseReason::kCount); r++) {
    copy.releases[r] = shm::StatLoad(live.releases[r]);
  }
  copy.crashes_charged = shm::StatLoad(live.crashes_charged);
  copy.infer_seconds = shm::LoadHistogram(live.infer_seconds);
  copy.queue_seconds = shm::LoadHistogram(live.queue_seconds);
  copy.load_seconds = shm::LoadHistogram(live.load_seconds);
  copy.unpark_seconds = shm::LoadHistogram(live.unpark_seconds);
  return copy;
}

// Stats have no seqlock: each word is atomic, and the one hazard is a reset (the record given to
// another model) between the first word and the last, which would mix two models' counters. An
// unchanged generation around the copy rules that out.
std::optional<shm::ModelStats> CopyModelStats(const shm::ModelStats& live) {
  for (int attempt = 0; attempt < 3; attempt++) {
    shm::ModelStats copy = LoadModelStatsOnce(live);
    if (shm::StatLoad(live.generation) == copy.generation) return copy;
  }
  return std::nullopt;
}

ModelSample FromRecord(uint32_t index, const shm::ModelRecord& r) {
  ModelSample m;
  m.record = index;
  m.name = Bounded(r.name, sizeof(r.name));
  m.state = static_cast<shm::ModelState>(r.state);
  m.device = r.device;
  m.bytes = r.weight_bytes + r.workspace_bytes;
  m.weight_bytes = r.weight_bytes;
  m.loaded_bytes = r.loaded_bytes;
  m.replicas = r.replicas;
  m.pinned = r.pinned != 0;
  m.inflight = r.inflight;
  m.error = Bounded(r.last_error, sizeof(r.last_error));
  return m;
}

std::string WorkerStateName(uint32_t state) {
  static const char* kNames[] = {"empty", "starting", "idle", "busy", "dead", "fatal"};
  return state < std::size(kNames) ? kNames[state] : "unknown";
}

WorkerSample FromRecord(uint32_t slot, const shm::WorkerRecord& r,
                        const std::vector<std::string>& model_names) {
  WorkerSample w;
  w.slot = slot;
  w.pid = r.pid;
  w.state = WorkerStateName(r.state);
  w.device = r.device;
  w.restarts = r.restarts;
  w.outstanding = r.outstanding;
  w.served = r.served;
  w.last_exit = ExitText(r.last_exit);
  const uint32_t shown = std::min(r.models, shm::kWorkerModelsShown);
  for (uint32_t i = 0; i < shown; i++) {
    const uint32_t model = r.held[i];
    if (model < model_names.size() && !model_names[model].empty())
      w.models.push_back(model_names[model]);
  }
  if (r.models > shown) w.models.push_back(fmt::format("+{} more", r.models - shown));
  return w;
}

PoolSample CopySegment(const shm::SegmentView& view) {
  PoolSample sample;
  // The header's own seqlock covers the device and park accounts.
  if (std::optional<shm::SegmentHeader> header = shm::SeqRead(view.header(), kSeqTries)) {
    for (uint32_t d = 0; d < header->device_count && d < shm::kMaxDevices; d++) {
      sample.devices.push_back({header->device_used_bytes[d], header->device_budget_bytes[d]});
    }
    sample.park = ParkSample{header->park_used_bytes, header->park_budget_bytes};
  }
  sample.stats = CopyPoolStats(view.pool_stats());
  sample.inflight = sample.stats->inflight;
  sample.queued = sample.stats->queued;
  std::vector<std::string> names(view.max_models());
  for (uint32_t i = 0; i < view.max_models(); i++) {
    std::optional<shm::ModelRecord> record = shm::SeqRead(view.model(i), kSeqTries);
    if (!record || record->state == static_cast<uint32_t>(shm::ModelState::kEmpty)) continue;
    ModelSample model = FromRecord(i, *record);
    model.stats = CopyModelStats(view.model_stats(i));
    names[i] = model.name;
    sample.models.push_back(std::move(model));
  }
  for (uint32_t slot = 0; slot < view.max_workers(); slot++) {
    std::optional<shm::WorkerRecord> record = shm::SeqRead(view.worker(slot), kSeqTries);
    if (!record || record->state == static_cast<uint32_t>(shm::WorkerState::kEmpty)) continue;
    sample.workers.push_back(FromRecord(slot, *record, names));
  }
  return sample;
}

}  // namespace

std::string ExitText(int32_t last_exit) {
  if (last_exit < 0) return "";
  if (last_exit > 128) {
    const int signal = last_exit - 128;
    return fmt::format("killed by signal {} ({})", signal, strsignal(signal));
  }
  return fmt::format("exited with status {}", last_exit);
}

shm::ModelState ModelStateFromName(std::string_view name) {
  for (uint32_t s = 0; s <= static_cast<uint32_t>(shm::ModelState::kUnloading); s++) {
    if (shm::ModelStateName(static_cast<shm::ModelState>(s)) == name)
      return static_cast<shm::ModelState>(s);
  }
  return shm::ModelState::kRegistered;
}

PoolSample SampleSegment(const shm::SegmentView& view) {
  // Each record's seqlock makes each record consistent. The supervisor also brackets each event's
  // writes with header.changes (odd while it writes): a copy taken between two equal even values
  // has accounts, models and workers that agree with each other (the bytes on a device are the
  // sum of its models'). A busy pool may not leave such a gap for a while; after a few tries the
  // per-record copy is shown, which is off by at most the event under way.
  PoolSample sample;
  for (int attempt = 0; attempt < kBatchTries; attempt++) {
    const uint64_t before = LoadChanges(view.header());
    sample = CopySegment(view);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (before % 2 == 0 && LoadChanges(view.header()) == before) break;
  }
  sample.taken = std::chrono::steady_clock::now();
  sample.taken_unix_ns = UnixNanos();
  return sample;
}

PoolSample SampleReplies(const v1::StatusReply& status, const v1::PsReply& ps) {
  PoolSample sample;
  sample.taken = std::chrono::steady_clock::now();
  sample.taken_unix_ns = UnixNanos();
  for (const v1::DeviceStatus& d : status.devices())
    sample.devices.push_back({d.used_bytes(), d.budget_bytes()});
  sample.inflight = status.inflight();
  sample.queued = status.queued();
  for (const v1::PsEntry& e : ps.models()) {
    ModelSample m;
    m.name = e.name();
    m.state = ModelStateFromName(e.state());
    m.device = e.device();
    m.bytes = e.bytes();
    m.weight_bytes = e.weight_bytes();
    m.loaded_bytes = e.loaded_bytes();
    m.replicas = e.replicas();
    m.pinned = e.pinned();
    m.inflight = e.inflight();
    m.error = e.last_error();
    sample.models.push_back(std::move(m));
  }
  for (const v1::WorkerStatus& s : status.workers()) {
    if (s.state() == "empty") continue;
    WorkerSample w;
    w.slot = s.slot();
    w.pid = s.pid();
    w.state = s.state();
    w.device = s.device();
    w.restarts = s.restarts();
    w.outstanding = s.outstanding();
    w.last_exit = s.last_exit();
    w.models.assign(s.models().begin(), s.models().end());
    sample.workers.push_back(std::move(w));
  }
  return sample;
}

}  // namespace warmpool::top
