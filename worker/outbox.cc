#include "worker/outbox.h"

#include <spdlog/spdlog.h>

namespace warmpool::worker {

void Outbox::Send(const v1::WorkerEnvelope& message, const std::vector<int>& fds) {
  if (Status s = channel_.Write(message, fds); !s.ok()) {
    spdlog::debug("worker {}: reply dropped: {}", slot_, s.ToString());
  }
}

void Outbox::SendFramed(const std::string& frames) {
  if (Status s = channel_.WriteRaw(frames); !s.ok()) {
    spdlog::debug("worker {}: replies dropped: {}", slot_, s.ToString());
  }
}

JobFaults Outbox::FaultsFor(uint64_t job, const google::protobuf::RepeatedPtrField<v1::Fault>& faults) {
  if (faults.empty()) return JobFaults();
  return JobFaults(faults, [this, job](uint64_t id) {
    // Written before the action runs, so the supervisor reads it even if we die right after.
    v1::WorkerEnvelope fired;
    fired.mutable_fault_fired()->set_id(id);
    fired.mutable_fault_fired()->set_job(job);
    Send(fired);
  });
}

}  // namespace warmpool::worker
