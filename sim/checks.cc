// The invariants, checked after every event the core handles (CheckAfterEvent), at every tick
// (CheckPeriodic: what needs time to pass) and once the daemon has stopped (CheckFinal).
#include <map>

#include <fmt/format.h>

#include "shm/model_index.h"
#include "sim/simulator.h"

namespace warmpool::sim {

namespace {

// An idle worker next to one holding several models, for this long: placement failed to spread.
constexpr uint64_t kStackedLimitMs = 3000;
// An inference is answered by its deadline; this much later it is overdue.
constexpr uint64_t kDeadlineSlackMs = 500;

}  // namespace

void Simulator::CheckAfterEvent() {
  if (failed_) return;
  if (Status s = shm::Validate(segment_); !s.ok()) return Fail("segment: " + s.message());
  if (Status s = core_->CheckInvariants(); !s.ok()) return Fail("core: " + s.message());

  // Handles: the core holds exactly the open ones the supervisor was given, each for one model.
  std::map<int, uint32_t> held;
  for (const auto& [model, handle] : core_->HeldHandles()) {
    if (!held.emplace(handle, model).second) {
      return Fail(fmt::format("handle {} is held twice (models {} and {})", handle, held[handle],
                              model));
    }
    if (supervisor_handles_.count(handle) == 0) {
      return Fail(fmt::format("the core holds handle {} for model {}, but it is closed", handle,
                              model));
    }
  }
  for (int handle : supervisor_handles_) {
    if (held.count(handle) == 0) {
      return Fail(fmt::format("handle {} is open in the supervisor but no model holds it (leak)",
                              handle));
    }
  }

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

void Simulator::CheckPeriodic() {
  if (failed_ || stopping_) return;
  for (const Client& c : clients_) {
    if (!c.connected) continue;
    for (const auto& [id, p] : c.outstanding) {
      if (p.kind != Pending::Kind::kInfer || !p.accepted) continue;
      if (now_ > p.sent_ms + p.deadline_ms + kDeadlineSlackMs) {
        return Fail(fmt::format("session {} request {} (infer \"{}\", deadline {} ms) has no answer "
                                "after {} ms",
                                c.session, id, p.model, p.deadline_ms, now_ - p.sent_ms));
      }
    }
  }
  // Placement: a worker with nothing to do next to one holding several models.
  bool idle = false, crowded = false;
  for (const Worker& w : workers_) {
    if (w.state != Worker::State::kUp) continue;
    bool busy = w.serving_job != 0 || w.load_job != 0 || !w.serving.empty() || !w.loads.empty();
    if (w.engines.empty() && !busy) idle = true;
    if (w.engines.size() >= 2) crowded = true;
  }
  if (!(idle && crowded)) {
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
