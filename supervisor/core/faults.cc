// Fault injection: armed through the client protocol only when the daemon runs with
// --enable-fault-injection. The daemon keeps the armed faults and grants their shots to jobs: a
// job whose kind holds the fault's point (a load holds load.*, an inference infer.*, ...) carries
// the fault to its worker, which can fire it only within that job. A shot is spent when granted
// and given back if the job ends without firing it, so a fault armed for N shots fires at most N
// times, however retries race.
#include <algorithm>

#include "ipc/fault_spec.h"
#include "supervisor/core/core.h"

namespace warmpool::supervisor {

bool Core::PointInJob(std::string_view point, Job::Kind kind) {
  if (point.starts_with("load.")) return kind == Job::Kind::kLoad;
  if (point.starts_with("infer.")) return kind == Job::Kind::kInfer;
  if (point == "unload.mid") return kind == Job::Kind::kUnload;
  if (point == "attach.mid") return kind == Job::Kind::kAttach || kind == Job::Kind::kUnpark;
  if (point == "park.mid") return kind == Job::Kind::kPark;
  return false;
}

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
  Answer(call, std::move(reply));
}

void Core::HandleFaultClear(const Call& call) {
  if (!config_.enable_fault_injection) {
    return AnswerError(call, Error(Code::kFailedPrecondition,
                                   "fault injection is disabled: start warmpoold with "
                                   "--enable-fault-injection"));
  }
  // Shots already granted stay with their jobs; nothing more is granted.
  v1::Envelope reply;
  reply.mutable_fault_clear_reply()->set_cleared(static_cast<uint32_t>(faults_.size()));
  faults_.clear();
  Answer(call, std::move(reply));
}

std::vector<v1::Fault> Core::GrantFaults(Job& job) {
  std::vector<v1::Fault> granted;
  if (faults_.empty()) return granted;
  const std::string& model = models_[job.model].entry.name;
  for (ArmedFault& f : faults_) {
    if (f.remaining == 0 || !PointInJob(f.fault.point(), job.kind)) continue;
    if (!f.fault.model().empty() && f.fault.model() != model) continue;
    if (++f.matched < std::max<uint32_t>(1, f.fault.after())) continue;
    f.remaining--;
    f.granted++;
    job.faults.push_back(f.fault.id());
    granted.push_back(f.fault);
  }
  return granted;
}

void Core::OnFaultFired(const v1::WorkerFaultFired& fired) {
  auto armed = std::find_if(faults_.begin(), faults_.end(),
                            [&](const ArmedFault& f) { return f.fault.id() == fired.id(); });
  if (armed != faults_.end()) {
    Log(LogLevel::kWarn, "fault {} fired: {} at {}", fired.id(), armed->fault.action(),
        armed->fault.point());
    armed->granted -= std::min<uint32_t>(armed->granted, 1);
    if (armed->remaining == 0 && armed->granted == 0) faults_.erase(armed);
  }
  // The shot is spent: the job's end does not give it back.
  if (Job* job = FindJob(fired.job())) std::erase(job->faults, fired.id());
}

void Core::ReturnFaults(const Job& job) {
  for (uint64_t id : job.faults) {
    auto armed = std::find_if(faults_.begin(), faults_.end(),
                              [&](const ArmedFault& f) { return f.fault.id() == id; });
    if (armed == faults_.end()) continue;  // cleared meanwhile
    armed->granted -= std::min<uint32_t>(armed->granted, 1);
    armed->remaining++;
  }
}

}  // namespace warmpool::supervisor
