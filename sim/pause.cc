// The supervisor paused: a SIGSTOP, a VM stall, a burst of swapping. Simulated time jumps while
// the world goes on: workers finish their jobs and write their replies, clients send requests,
// processes die; none of it reaches the core, which is not running. When it resumes, libuv's loop
// runs its expired timers before it polls for I/O, so the tick comes first and what was sent
// meanwhile is read after it, in the order it was sent: the tick reads the workers' channels
// first, as daemon.cc's does (or, on some ticks here, does not), and tells the core how far the
// reading got (event::Tick).
//
// What must hold (CheckKill, CheckDeadlineReply): no worker that answered in time is killed as
// hung, and no request whose reply a worker sent before its deadline fails with
// DEADLINE_EXCEEDED. "In time" is judged by the simulator's clock, when the worker wrote the
// reply, not when the supervisor got round to reading it.
#include <cstring>

#include <fmt/format.h>

#include "sim/simulator.h"

namespace warmpool::sim {

namespace event = supervisor::event;

namespace {

constexpr uint64_t kUnixBaseMs = 1'760'000'000'000ull;  // Simulator::Now()'s unix clock at 0

}  // namespace

void Simulator::Tick() {
  if (workers_stopped_ || failed_) return;
  if (paused_) {
    tick_missed_ = true;  // Resume ticks, and the ticks go on from there
    return;
  }
  // The shell reads every worker's channel before it ticks (supervisor/daemon.cc); some ticks here
  // come before that, as libuv's timers come before its poll for I/O: the core is told how far
  // the reading had got, and must judge no one on what it has not read.
  if (rng_.Chance(800)) {
    for (Worker& w : workers_) {
      while (!w.to_core.empty() && !failed_) DeliverToCore(w.slot, w.generation);
    }
  }
  if (failed_ || workers_stopped_) return;
  event::Tick tick;
  tick.workers_read_ms = WorkersReadThrough();
  tick.clients_read_ms = ClientsReadThrough();
  Deliver(tick, tick.workers_read_ms < now_ || tick.clients_read_ms < now_
                    ? fmt::format("tick (workers read through {} ms, clients through {} ms)",
                                  tick.workers_read_ms, tick.clients_read_ms)
                    : std::string("tick"));
  if (!failed_ && !workers_stopped_) CheckStoreKeepsUp();
  CheckPeriodic();
  After(supervisor::kTickMs, [this] { Tick(); });
}

bool Simulator::Hold(std::function<void()> fn) {
  if (!paused_) return false;
  held_.push_back(std::move(fn));
  return true;
}

std::function<void()> Simulator::Reading(std::function<void()> fn) {
  return [this, fn = std::move(fn)] {
    if (!Hold(fn)) fn();
  };
}

void Simulator::Pause(uint64_t ms) {
  if (paused_) return;
  paused_ = true;
  Trace(fmt::format("== the supervisor is paused for {} ms", ms));
  After(ms, [this] { Resume(); });
}

void Simulator::Resume() {
  if (!paused_) return;
  paused_ = false;
  resumed_ms_ = now_;
  Trace("== the supervisor resumes");
  // Time-based checks measure the daemon, not the pause.
  stacked_since_ms_ = starved_since_ms_ = 0;
  // The timers phase: the tick that came due while it was stopped (one, however many were missed).
  if (tick_missed_) {
    tick_missed_ = false;
    Tick();
  }
  // The poll phase: what the workers and clients sent meanwhile, in order.
  std::vector<std::function<void()>> held;
  held.swap(held_);
  for (auto& fn : held) {
    if (failed_) return;
    if (!Hold(fn)) fn();  // paused again by what was read (the environment's next act)
  }
}

uint64_t Simulator::WorkersReadThrough() const {
  uint64_t through = now_;
  for (const Worker& w : workers_) {
    if (!w.to_core.empty()) through = std::min(through, w.to_core.front().sent_ms);
  }
  return through;
}

uint64_t Simulator::ClientsReadThrough() const {
  uint64_t through = now_;
  for (const Client& c : clients_) {
    if (!c.connected) continue;
    for (const auto& [id, p] : c.outstanding) {
      if (!p.accepted) through = std::min(through, p.sent_ms);
    }
  }
  return through;
}

void Simulator::NoteInferSent(uint32_t slot, const v1::WorkerEnvelope& message) {
  const v1::WorkerInfer& infer = message.infer();
  SentInfer sent;
  sent.slot = slot;
  sent.generation = workers_[slot].generation;
  if (infer.deadline_unix_ms() > 0) sent.deadline_ms = static_cast<uint64_t>(infer.deadline_unix_ms()) - kUnixBaseMs;
  sent.due_when_sent = sent.deadline_ms != 0 && sent.deadline_ms <= now_;
  if (infer.input().data().size() >= sizeof(float)) {
    float token = 0;
    std::memcpy(&token, infer.input().data().data(), sizeof(float));
    sent.token = static_cast<uint32_t>(token);
  }
  sent_infers_[infer.job()] = sent;
  job_tokens_[infer.job()] = sent.token;
}

void Simulator::NoteReplySent(const v1::WorkerEnvelope& reply) {
  if (!reply.has_infer_done()) return;
  auto it = sent_infers_.find(reply.infer_done().job());
  if (it == sent_infers_.end() || it->second.deadline_ms == 0) return;
  SentInfer& sent = it->second;
  sent.replied_ms = std::min(sent.replied_ms, now_);
  if (sent.token != 0 && now_ <= sent.deadline_ms && !sent.due_when_sent) in_time_tokens_[sent.token] = now_;
  // Answered in time, so it can never justify a kill: forgotten. A late answer stays, and does.
  if (now_ <= sent.deadline_ms + config_.inference_grace_ms) sent_infers_.erase(it);
}

void Simulator::ForgetInfers(uint32_t slot, uint32_t generation) {
  std::erase_if(sent_infers_, [&](const auto& entry) {
    return entry.second.slot == slot && entry.second.generation == generation;
  });
}

void Simulator::DisbelieveDevice(uint32_t device) {
  for (const Worker& w : workers_) {
    if (w.device != device) continue;
    for (const Worker::ToCore& unread : w.to_core) {
      if (!unread.message.has_infer_done()) continue;
      auto token = job_tokens_.find(unread.message.infer_done().job());
      if (token != job_tokens_.end()) in_time_tokens_.erase(token->second);
    }
  }
}

void Simulator::CheckKill(uint32_t slot, const std::string& reason) {
  if (reason.find("overran its deadline") == std::string::npos) return;
  const uint32_t generation = workers_[slot].generation;
  for (const auto& [job, sent] : sent_infers_) {
    if (sent.slot != slot || sent.generation != generation || sent.deadline_ms == 0) continue;
    const uint64_t due = sent.deadline_ms + config_.inference_grace_ms;
    if (due < now_ && sent.replied_ms > due) return;  // it did overrun
  }
  Fail(fmt::format("worker {} was killed as hung ({}), but it answered every job that was overdue "
                   "before its deadline and grace ran out",
                   slot, reason));
}

void Simulator::CheckDeadlineReply(uint64_t session, const v1::Envelope& reply) {
  if (!reply.has_error() || reply.error().code() != v1::DEADLINE_EXCEEDED) return;
  for (const Client& c : clients_) {
    if (c.session != session) continue;
    auto it = c.outstanding.find(reply.request_id());
    if (it == c.outstanding.end() || it->second.token == 0) return;
    auto in_time = in_time_tokens_.find(it->second.token);
    if (in_time == in_time_tokens_.end()) return;
    return Fail(fmt::format("session {} request {} (infer \"{}\") failed with DEADLINE_EXCEEDED "
                            "({}), though a worker sent its reply at {} ms, before the deadline",
                            session, reply.request_id(), it->second.model, reply.error().message(),
                            in_time->second));
  }
}

}  // namespace warmpool::sim
