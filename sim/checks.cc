// The invariants, checked after every event the core handles (CheckAfterEvent), at every tick
// (CheckPeriodic: what needs time to pass) and once the daemon has stopped (CheckFinal).
#include <map>

#include <fmt/format.h>

#include "shm/model_index.h"
#include "sim/simulator.h"

#include <algorithm>

namespace warmpool::sim {

namespace {

// An idle worker next to one holding several models, for this long: placement failed to spread.
constexpr uint64_t kStackedLimitMs = 3000;
// How long a request may wait for a resident model while nothing serves it and a worker idles.
constexpr uint64_t kStarvedLimitMs = 1000;
// An inference is answered by its deadline; this much later it is overdue.
constexpr uint64_t kDeadlineSlackMs = 500;

}  // namespace

void Simulator::CheckAfterEvent() {
  if (failed_) return;
  if (Status s = shm::Validate(segment_); !s.ok()) return Fail("segment: " + s.message());
  if (Status s = core_->CheckInvariants(); !s.ok()) return Fail("core: " + s.message());
  if (ticks_store_behind_ > 0 && StoreHoldsKept()) ticks_store_behind_ = 0;

  // Handles: the core holds exactly the open ones the supervisor was given, each for one model.
  std::map<int, uint32_t> held;
  for (const auto& [model, handle] : core_->HeldHandles()) {
    if (!held.emplace(handle, model).second) {
      return Fail(fmt::format("handle {} is held twice (models {} and {})", handle, held[handle],
                              model));
    }
    if (supervisor_handles_.count(handle) == 0) {
      return Fail(fmt::format("the core holds handle {} for model {} (or a client region), but it is closed", handle,
                              model));
    }
  }
  for (int handle : supervisor_handles_) {
    if (held.count(handle) == 0) {
      return Fail(fmt::format("handle {} is open in the supervisor but no model or client region holds it (leak)",
                              handle));
    }
  }
  CheckKeptMemory();
  if (failed_) return;
  CheckKvPages();
  if (failed_) return;

  // Bytes of accepted, unanswered requests: the simulated clients can pipeline more than the
  // daemon may hold in large inputs; it must refuse what does not fit.
  const uint64_t kMaxHeldBytes = config_.max_queued_bytes;
  const uint64_t kMaxHeldBytesPerSession = config_.max_queued_bytes_per_connection;
  uint64_t total = 0;
  for (const Client& c : clients_) {
    if (!c.connected) continue;
    uint64_t mine = 0;
    for (const auto& [id, p] : c.outstanding) mine += p.accepted && !p.replied ? p.bytes : 0;
    if (mine > kMaxHeldBytesPerSession) {
      return Fail(fmt::format("session {} has {} bytes of requests held by the daemon (bound {})",
                              c.session, mine, kMaxHeldBytesPerSession));
    }
    total += mine;
  }
  if (total > kMaxHeldBytes) {
    return Fail(fmt::format("the daemon holds {} bytes of requests (bound {})", total, kMaxHeldBytes));
  }
}

bool Simulator::RoomToMoveFrom(const Worker& w) const {
  const shm::ModelIndex& index = core_->index();
  const uint64_t used = index.DeviceUsed(w.device), budget = index.DeviceBudget(w.device);
  for (const auto& [model, engine] : w.engines) {
    if (model >= index.view().max_models() || index.State(model) != shm::ModelState::kReady) continue;
    const shm::ModelRecord& r = index.Get(model);
    const uint64_t workspace = r.workspace_bytes / std::max<uint32_t>(1, r.replicas);
    if (budget == 0 || used + workspace <= budget) return true;
  }
  return false;
}

void Simulator::CheckPeriodic() {
  if (failed_ || stopping_) return;
  for (const Client& c : clients_) {
    if (!c.connected) continue;
    for (const auto& [id, p] : c.outstanding) {
      if (p.kind != Pending::Kind::kInfer || !p.accepted) continue;
      // A pause of the supervisor stops its clock for this check: a request sent meanwhile is
      // read when it resumes, and its deadline runs from then (as the daemon measures it).
      if (now_ > std::max(p.sent_ms, resumed_ms_) + p.deadline_ms + kDeadlineSlackMs) {
        return Fail(fmt::format("session {} request {} (infer \"{}\", deadline {} ms) has no answer "
                                "after {} ms",
                                c.session, id, p.model, p.deadline_ms, now_ - p.sent_ms));
      }
    }
  }
  // Placement: a worker with nothing to do next to one of the same device holding several models
  // (weights move within their device only), where the device has room for a move: one more
  // replica's workspace of a model the crowded worker holds (a move attaches before it lets go;
  // evicting a cached model to spread the rest is not worth it).
  auto busy = [](const Worker& w) {
    return w.serving_job != 0 || w.load_job != 0 || !w.serving.empty() || !w.loads.empty() ||
           w.unwritten != 0 || !w.to_core.empty();
  };
  const uint32_t devices = static_cast<uint32_t>(config_.devices.size());
  std::vector<bool> idle_on(devices, false), crowded_on(devices, false), any_idle_on(devices, false);
  for (const Worker& w : workers_) {
    if (w.state != Worker::State::kUp) continue;
    if (w.engines.empty() && !busy(w)) idle_on[w.device] = true;
    if (!busy(w)) any_idle_on[w.device] = true;
    if (w.engines.size() >= 2 && RoomToMoveFrom(w)) crowded_on[w.device] = true;
  }
  bool stacked = false;
  for (uint32_t d = 0; d < devices; d++) stacked = stacked || (idle_on[d] && crowded_on[d]);
  // Liveness: a request waits for a resident model while no worker holding it has anything to do
  // and some worker of its device idles (a replica that is gone but never replaced, say).
  // Requests carry deadlines, so this would otherwise end as DEADLINE_EXCEEDED and pass for load.
  std::string starved;
  for (const Client& c : clients_) {
    if (!c.connected || !starved.empty()) continue;
    for (const auto& [id, p] : c.outstanding) {
      // A generation too: one a replica's KV cache had no room for waits for room that a busy
      // worker's generations give back as they end.
      if ((p.kind != Pending::Kind::kInfer && p.kind != Pending::Kind::kGenerate) || !p.accepted || p.replied) continue;
      uint32_t model = core_->index().Find(p.model);
      if (model == shm::kNil || core_->index().State(model) != shm::ModelState::kReady) continue;
      if (!any_idle_on[core_->index().Get(model).device]) continue;
      bool served = std::any_of(workers_.begin(), workers_.end(), [&](const Worker& w) {
        return w.state == Worker::State::kUp && busy(w) && w.engines.count(model) != 0;
      });
      if (!served) {
        starved = fmt::format("session {} request {} ({} \"{}\")", c.session, id,
                              p.kind == Pending::Kind::kInfer ? "infer" : "generate", p.model);
        break;
      }
    }
  }
  if (starved.empty()) {
    starved_since_ms_ = 0;
  } else if (starved_since_ms_ == 0) {
    starved_since_ms_ = now_;
  } else if (now_ - starved_since_ms_ > kStarvedLimitMs) {
    return Fail(fmt::format("{} has waited {} ms for a resident model that no busy worker holds, "
                            "while a worker idles",
                            starved, now_ - starved_since_ms_));
  }
  // Every model a quiet worker holds is one the supervisor knows it holds: anything else is memory
  // nobody will ever tell it to let go (an unload that overtook its attach, say).
  for (const Worker& w : workers_) {
    if (w.state != Worker::State::kUp || busy(w)) continue;
    const shm::WorkerRecord& record = segment_.worker(w.slot);
    if (record.outstanding != 0 || record.models > shm::kWorkerModelsShown) continue;
    for (const auto& [model, engine] : w.engines) {
      if (std::find(record.held, record.held + record.models, model) == record.held + record.models) {
        return Fail(fmt::format("worker {} holds model {}, which the supervisor does not know it holds: "
                                "nothing will ever let it go",
                                w.slot, model));
      }
    }
  }
  if (!stacked) {
    stacked_since_ms_ = 0;
  } else if (stacked_since_ms_ == 0) {
    stacked_since_ms_ = now_;
  } else if (now_ - stacked_since_ms_ > kStackedLimitMs) {
    std::string layout;
    for (const Worker& w : workers_) layout += fmt::format(" worker {}: {} models;", w.slot, w.engines.size());
    return Fail(fmt::format("a worker has idled for {} ms while another holds several models:{}",
                            now_ - stacked_since_ms_, layout));
  }
}

void Simulator::CheckFinal() {
  if (failed_) return;
  if (Status s = shm::Validate(segment_); !s.ok()) return Fail("segment at the end: " + s.message());
}

}  // namespace warmpool::sim
