#include "supervisor/core/scheduler.h"

#include <string>

#include "common/units.h"

namespace warmpool::supervisor {

using shm::ModelState;

AdmissionPlan PlanAdmission(const shm::ModelIndex& index, uint32_t model, uint32_t device,
                            uint64_t bytes, const PoolLimits& limits) {
  AdmissionPlan plan;
  const uint64_t budget = index.DeviceBudget();
  const std::string name = index.Get(model).name;
  if (budget != 0 && bytes > budget) {
    plan.reason = Error(Code::kResourceExhausted,
                        "model \"{}\" needs {} but the device budget is {}: raise --budget or "
                        "[pool] budget",
                        name, FormatBytes(bytes), FormatBytes(budget));
    return plan;
  }

  uint64_t used = index.DeviceUsed(device);
  // capacity is per device: models resident on other devices take none of this one's slots.
  uint32_t resident = 0;
  for (uint32_t i : index.LruOrder()) {
    resident += index.Get(i).device == device && shm::OnDevice(index.State(i)) ? 1 : 0;
  }
  auto fits = [&](uint64_t used_now, uint32_t resident_now) {
    bool by_bytes = budget == 0 || used_now + bytes <= budget;
    bool by_count = limits.capacity == 0 || resident_now < limits.capacity;
    return by_bytes && by_count;
  };
  if (fits(used, resident)) {
    plan.kind = AdmissionPlan::Kind::kAdmit;
    return plan;
  }

  // Bytes and slots that will come back without any decision of ours: unloads already under way.
  // Then, LRU first, idle unpinned ready models as victims.
  uint64_t after = used;
  uint32_t resident_after = resident;
  bool something_busy = false;
  std::vector<std::string> pinned;
  for (uint32_t i : index.LruOrder()) {
    const shm::ModelRecord& r = index.Get(i);
    if (i == model || r.device != device) continue;
    auto state = static_cast<ModelState>(r.state);
    if (state == ModelState::kUnloading) {
      after -= r.weight_bytes + r.workspace_bytes;
      resident_after--;
    }
  }
  for (uint32_t i : index.LruOrder()) {
    if (fits(after, resident_after)) break;
    const shm::ModelRecord& r = index.Get(i);
    if (i == model || r.device != device) continue;
    auto state = static_cast<ModelState>(r.state);
    if (state == ModelState::kUnloading || state == ModelState::kParked) continue;  // no device bytes
    if (r.pinned) {
      pinned.push_back(r.name);
      continue;
    }
    if (state != ModelState::kReady || r.inflight != 0) {
      something_busy = true;
      continue;
    }
    plan.victims.push_back(i);
    after -= r.weight_bytes + r.workspace_bytes;
    resident_after--;
  }
  if (fits(after, resident_after)) {
    plan.kind = plan.victims.empty() ? AdmissionPlan::Kind::kWait : AdmissionPlan::Kind::kEvict;
    return plan;
  }
  if (something_busy || after != used) {
    // Busy models become evictable when their requests finish: evict what we can and wait.
    plan.kind = plan.victims.empty() ? AdmissionPlan::Kind::kWait : AdmissionPlan::Kind::kEvict;
    return plan;
  }
  plan.victims.clear();
  std::string names;
  for (const std::string& n : pinned) names += (names.empty() ? "" : ", ") + n;
  plan.reason = Error(Code::kResourceExhausted,
                      "no room for model \"{}\" ({}): {} of {} in use{}{}; unpin or unload a model, "
                      "or raise the budget",
                      name, FormatBytes(bytes), FormatBytes(used), FormatBytes(budget),
                      pinned.empty() ? "" : ", pinned: ", names);
  return plan;
}

uint32_t PickWorkerForLoad(const std::vector<WorkerLoad>& workers) {
  uint32_t best = shm::kNil;
  const WorkerLoad* best_load = nullptr;
  for (const WorkerLoad& w : workers) {
    if (!w.alive) continue;
    if (best_load == nullptr || w.models < best_load->models ||
        (w.models == best_load->models && w.outstanding < best_load->outstanding)) {
      best = w.slot;
      best_load = &w;
    }
  }
  return best;
}

}  // namespace warmpool::supervisor
