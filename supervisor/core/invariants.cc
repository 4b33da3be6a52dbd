// The core's own invariants, across the index, the per-model runtime and the jobs: what the
// simulator checks after every event (the segment's invariants are shm::Validate's).
#include <algorithm>
#include <map>

#include "supervisor/core/core.h"

namespace warmpool::supervisor {

using shm::ModelState;

Status Core::CheckInvariants() const {
  std::map<uint32_t, uint32_t> file_loads;
  for (const auto& [id, job] : jobs_) {
    if (job.kind == Job::Kind::kLoad && !job.attach && ++file_loads[job.model] > 1) {
      return Error(Code::kInternal, "two file loads of \"{}\" at once", index_->Get(job.model).name);
    }
  }
  for (uint32_t model : index_->All()) {
    const ModelRuntime& rt = runtime_[model];
    const shm::ModelRecord& r = index_->Get(model);
    ModelState state = index_->State(model);
    const std::string name = r.name;
    if (r.replicas > workers_.size()) {
      return Error(Code::kInternal, "\"{}\" has {} replicas on {} workers", name, r.replicas,
                   workers_.size());
    }
    std::vector<uint32_t> slots = rt.replica_slots;
    std::sort(slots.begin(), slots.end());
    if (std::adjacent_find(slots.begin(), slots.end()) != slots.end()) {
      return Error(Code::kInternal, "\"{}\" counts one worker twice among its replicas", name);
    }
    if (state == ModelState::kReady && !rt.replica_slots.empty()) {
      if (r.replicas != rt.replica_slots.size()) {
        return Error(Code::kInternal, "\"{}\" shows {} replicas but {} workers serve it", name,
                     r.replicas, rt.replica_slots.size());
      }
      uint64_t workspace = rt.workspace_bytes * rt.replica_slots.size();
      if (r.workspace_bytes != workspace) {
        return Error(Code::kInternal, "\"{}\" accounts {} bytes of workspace for {} replicas of {}",
                     name, r.workspace_bytes, rt.replica_slots.size(), rt.workspace_bytes);
      }
    }
    if (state == ModelState::kReady && r.weight_bytes > 0 && rt.weights_fd < 0) {
      return Error(Code::kInternal, "\"{}\" is ready with no weights held", name);
    }
    if (state == ModelState::kParked && r.weight_bytes > 0 && rt.park_fd < 0) {
      return Error(Code::kInternal, "\"{}\" is parked with no host copy held", name);
    }
    if (!shm::IsResident(state) && rt.weights_fd >= 0) {
      return Error(Code::kInternal, "weights of \"{}\" held while it is {}", name,
                   shm::ModelStateName(state));
    }
    if (!shm::IsResident(state) && rt.park_fd >= 0) {
      return Error(Code::kInternal, "a host copy of \"{}\" held while it is {}", name,
                   shm::ModelStateName(state));
    }
  }
  return OkStatus();
}

}  // namespace warmpool::supervisor
