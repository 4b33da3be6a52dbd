#include "top/top_tracker.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <utility>

namespace warmpool::top {

namespace {

uint64_t Delta(uint64_t before, uint64_t after) { return after >= before ? after - before : 0; }

std::string Times(uint64_t n) { return n > 1 ? fmt::format(" x{}", n) : ""; }

int StateRank(shm::ModelState state) {
  switch (state) {
    case shm::ModelState::kReady:
      return 0;
    case shm::ModelState::kLoading:
      return 1;
    case shm::ModelState::kUnloading:
      return 2;
    case shm::ModelState::kParked:
      return 3;
    case shm::ModelState::kFailed:
      return 4;
    default:
      return 5;
  }
}

std::string LoadText(shm::LoadSource source, const std::string& name) {
  switch (source) {
    case shm::LoadSource::kFile:
      return fmt::format("loaded {} from its file", name);
    case shm::LoadSource::kAttach:
      return fmt::format("attached {} to another worker (replica)", name);
    case shm::LoadSource::kUnpark:
      return fmt::format("unparked {}", name);
    case shm::LoadSource::kCount:
      break;
  }
  return fmt::format("loaded {}", name);
}

const char* ReleaseCause(shm::ReleaseReason reason) {
  switch (reason) {
    case shm::ReleaseReason::kBudget:
      return "device budget";
    case shm::ReleaseReason::kCapacity:
      return "capacity";
    case shm::ReleaseReason::kKeepAlive:
      return "keep_alive ran out";
    case shm::ReleaseReason::kSingleActive:
      return "single_active";
    case shm::ReleaseReason::kExplicit:
      return "asked";
    case shm::ReleaseReason::kReload:
      return "reload: changed or removed";
    case shm::ReleaseReason::kFailure:
      return "its worker or device failed";
    case shm::ReleaseReason::kCount:
      break;
  }
  return "unknown reason";
}

// Evicted when room was needed, lost to a failure, released otherwise; parked when its host copy
// is what is left of it now.
std::string ReleaseText(shm::ReleaseReason reason, const ModelSample& now) {
  const char* what =
      reason == shm::ReleaseReason::kBudget || reason == shm::ReleaseReason::kCapacity ? "evicted"
      : reason == shm::ReleaseReason::kFailure                                         ? "lost"
                                                                                       : "released";
  if (now.state == shm::ModelState::kParked) what = "parked";
  return fmt::format("{} {} ({})", what, now.name, ReleaseCause(reason));
}

// The same model as before with counters that continue the earlier ones: same record, same name,
// and no reset in between (ModelStats.generation; a record given to another model starts afresh).
bool Continues(const ModelSample& before, const ModelSample& now) {
  if (before.record != now.record || before.name != now.name) return false;
  if (before.stats.has_value() != now.stats.has_value()) return false;
  return !now.stats || before.stats->generation == now.stats->generation;
}

bool WorkerDown(const std::string& state) { return state == "dead" || state == "fatal"; }

}  // namespace

ModelRates RatesBetween(const shm::ModelStats& before, const shm::ModelStats& after,
                        double seconds) {
  ModelRates rates;
  if (seconds <= 0) return rates;
  const uint32_t infer = static_cast<uint32_t>(shm::RequestKind::kInfer);
  uint64_t answered = 0, failed = 0;
  for (uint32_t code = 0; code < shm::kCodes; code++) {
    const uint64_t n = Delta(before.requests[infer][code], after.requests[infer][code]);
    answered += n;
    if (code != 0) failed += n;
  }
  rates.requests_per_second = static_cast<double>(answered) / seconds;
  if (answered > 0) rates.error_ratio = static_cast<double>(failed) / static_cast<double>(answered);
  const shm::Histogram latency = shm::Difference(after.infer_seconds, before.infer_seconds);
  uint64_t observed = 0;
  for (uint64_t n : latency.buckets) observed += n;
  if (observed > 0) {
    rates.p50_seconds = shm::Quantile(latency, 0.50);
    rates.p99_seconds = shm::Quantile(latency, 0.99);
  }
  return rates;
}

bool ShownBefore(const ModelRow& a, const ModelRow& b) {
  const int rank_a = StateRank(a.model.state), rank_b = StateRank(b.model.state);
  if (rank_a != rank_b) return rank_a < rank_b;
  const double rps_a = a.rates.requests_per_second.value_or(0);
  const double rps_b = b.rates.requests_per_second.value_or(0);
  if (rps_a != rps_b) return rps_a > rps_b;
  if (a.model.inflight != b.model.inflight) return a.model.inflight > b.model.inflight;
  return a.model.name < b.model.name;
}

void Tracker::Note(uint64_t unix_ns, std::string text) {
  events_.push_front(Event{unix_ns, std::move(text)});
  while (events_.size() > events_kept_) events_.pop_back();
}

Frame Tracker::Next(PoolSample sample) {
  Frame frame;
  std::map<std::string, const ModelSample*> before;
  if (previous_) {
    frame.interval_seconds = std::chrono::duration<double>(sample.taken - previous_->taken).count();
    for (const ModelSample& m : previous_->models) before.emplace(m.name, &m);
    NoteModelChanges(sample);
    NoteWorkerChanges(sample);
  }
  for (const ModelSample& m : sample.models) {
    ModelRow row{m, {}};
    auto it = before.find(m.name);
    if (it != before.end() && Continues(*it->second, m) && m.stats) {
      row.rates = RatesBetween(*it->second->stats, *m.stats, frame.interval_seconds);
    }
    const bool busy = row.rates.requests_per_second.value_or(0) > 0 || m.inflight > 0;
    if (m.state == shm::ModelState::kRegistered && !busy) {
      frame.idle_registered++;
      continue;
    }
    frame.models.push_back(std::move(row));
  }
  std::sort(frame.models.begin(), frame.models.end(), ShownBefore);
  frame.events = Events();
  frame.pool = std::move(sample);
  previous_ = frame.pool;
  return frame;
}

void Tracker::NoteModelChanges(const PoolSample& now) {
  std::map<std::string, const ModelSample*> before;
  for (const ModelSample& m : previous_->models) before.emplace(m.name, &m);
  for (const ModelSample& m : now.models) {
    auto it = before.find(m.name);
    const ModelSample* was = it != before.end() && Continues(*it->second, m) ? it->second : nullptr;
    if (it != before.end()) before.erase(it);
    if (m.state == shm::ModelState::kFailed &&
        (was == nullptr || was->state != shm::ModelState::kFailed)) {
      Note(now.taken_unix_ns,
           fmt::format("{} failed: {}", m.name, m.error.empty() ? "no reason given" : m.error));
    }
    if (was != nullptr && was->stats && m.stats) {
      // Counters name the cause (which source a load came from, why a model was let go), and
      // catch what came and went between two refreshes, which states alone would miss.
      for (uint32_t s = 0; s < static_cast<uint32_t>(shm::LoadSource::kCount); s++) {
        if (uint64_t n = Delta(was->stats->loads[s], m.stats->loads[s])) {
          Note(now.taken_unix_ns, LoadText(static_cast<shm::LoadSource>(s), m.name) + Times(n));
        }
      }
      for (uint32_t r = 0; r < static_cast<uint32_t>(shm::ReleaseReason::kCount); r++) {
        if (uint64_t n = Delta(was->stats->releases[r], m.stats->releases[r])) {
          Note(now.taken_unix_ns, ReleaseText(static_cast<shm::ReleaseReason>(r), m) + Times(n));
        }
      }
      if (uint64_t n = Delta(was->stats->crashes_charged, m.stats->crashes_charged)) {
        Note(now.taken_unix_ns, fmt::format("{} charged with a worker crash{} ({} in all)", m.name,
                                            Times(n), m.stats->crashes_charged));
      }
    } else if (!m.stats) {
      // The socket has no counters: the states say what changed, without the reasons.
      const bool was_ready = was != nullptr && was->state == shm::ModelState::kReady;
      const bool was_parked = was != nullptr && was->state == shm::ModelState::kParked;
      if (m.state == shm::ModelState::kReady && !was_ready)
        Note(now.taken_unix_ns, m.name + " ready");
      if (m.state == shm::ModelState::kParked && !was_parked)
        Note(now.taken_unix_ns, m.name + " parked");
    }
  }
  if (!now.from_segment()) {
    // `ps` lists resident and failed models only: one that left it was let go.
    for (const auto& [name, was] : before) Note(now.taken_unix_ns, name + " unloaded");
  }
}

void Tracker::NoteWorkerChanges(const PoolSample& now) {
  std::map<uint32_t, const WorkerSample*> before;
  for (const WorkerSample& w : previous_->workers) before.emplace(w.slot, &w);
  for (const WorkerSample& w : now.workers) {
    auto it = before.find(w.slot);
    if (it == before.end()) continue;
    const WorkerSample& was = *it->second;
    // The daemon counts a restart when the worker dies; a respawn may follow before the next
    // refresh, so the count (not the dead state, which may never be seen) says it happened.
    const uint32_t deaths = w.restarts > was.restarts ? w.restarts - was.restarts : 0;
    const bool went_down = WorkerDown(w.state) && !WorkerDown(was.state);
    if (deaths == 0 && !went_down) continue;
    std::string text = fmt::format("worker {} (pid {}) {}", w.slot, was.pid,
                                   w.last_exit.empty() ? "died" : w.last_exit);
    if (deaths > 1) text += fmt::format(" ({} restarts)", deaths);
    if (w.state == "fatal") text += "; fatal, not respawned";
    Note(now.taken_unix_ns, std::move(text));
  }
}

}  // namespace warmpool::top
