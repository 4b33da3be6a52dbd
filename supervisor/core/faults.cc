// Fault injection: armed through the client protocol only when the daemon runs with
// --enable-fault-injection. The daemon keeps the armed set and its remaining shots; every worker
// holds a copy (sent again to each respawned worker) and reports each firing before it acts.
#include "ipc/fault_spec.h"
#include "supervisor/core/core.h"

namespace warmpool::supervisor {

void Core::HandleFaultArm(const Call& call, const v1::FaultArmRequest& request) {
  if (!config_.enable_fault_injection) {
    return AnswerError(call, Error(Code::kFailedPrecondition,
                                   "fault injection is disabled: start warmpoold with "
                                   "--enable-fault-injection (never in production)"));
  }
  if (Status s = ipc::CheckFaultPoint(request.point()); !s.ok()) return AnswerError(call, s);
  if (Status s = ipc::CheckFaultAction(request.action()); !s.ok()) return AnswerError(call, s);
  if (!request.model().empty() && index_->Find(request.model()) == shm::kNil) {
    return AnswerError(call, Error(Code::kNotFound, "model \"{}\" is not registered",
                                   request.model()));
  }
  ArmedFault armed;
  armed.fault.set_id(next_fault_id_++);
  armed.fault.set_point(request.point());
  armed.fault.set_action(request.action());
  armed.fault.set_model(request.model());
  armed.fault.set_after(request.after());
  armed.remaining = request.times() == 0 ? 1 : request.times();
  Log(LogLevel::kWarn, "fault {} armed: {} at {}{} (after {}, {} time(s))", armed.fault.id(),
      request.action(), request.point(),
      request.model().empty() ? "" : " for model " + request.model(),
      std::max<uint32_t>(1, request.after()), armed.remaining);
  v1::Envelope reply;
  reply.mutable_fault_arm_reply()->set_id(armed.fault.id());
  faults_.push_back(std::move(armed));
  BroadcastFaults();
  Answer(call, std::move(reply));
}

void Core::HandleFaultClear(const Call& call) {
  if (!config_.enable_fault_injection) {
    return AnswerError(call, Error(Code::kFailedPrecondition,
                                   "fault injection is disabled: start warmpoold with "
                                   "--enable-fault-injection"));
  }
  v1::Envelope reply;
  reply.mutable_fault_clear_reply()->set_cleared(static_cast<uint32_t>(faults_.size()));
  faults_.clear();
  BroadcastFaults();
  Answer(call, std::move(reply));
}

void Core::OnFaultFired(uint64_t id) {
  for (auto it = faults_.begin(); it != faults_.end(); ++it) {
    if (it->fault.id() != id) continue;
    Log(LogLevel::kWarn, "fault {} fired: {} at {}", id, it->fault.action(), it->fault.point());
    if (--it->remaining == 0) {
      faults_.erase(it);
      BroadcastFaults();
    }
    return;
  }
}

void Core::SendFaults(uint32_t slot) {
  if (!config_.enable_fault_injection) return;
  v1::WorkerEnvelope message;
  v1::WorkerFaultSet* set = message.mutable_fault_set();
  for (const ArmedFault& f : faults_) *set->add_faults() = f.fault;
  SendToWorker(slot, message);
}

void Core::BroadcastFaults() {
  for (uint32_t slot = 0; slot < workers_.size(); slot++) SendFaults(slot);
}

}  // namespace warmpool::supervisor
