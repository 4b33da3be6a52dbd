#include "supervisor/policy/admission.h"

#include "common/units.h"

namespace warmpool::supervisor::policy {

using Where = Resident::Where;

AdmissionPlan PlanAdmission(const std::vector<Resident>& lru, uint32_t model,
                            const std::string& name, uint64_t bytes, uint64_t used,
                            const Limits& limits) {
  AdmissionPlan plan;
  const uint64_t budget = limits.budget_bytes;
  if (budget != 0 && bytes > budget) {
    plan.reason = Error(Code::kResourceExhausted,
                        "model \"{}\" needs {} but the device budget is {}: raise --budget or "
                        "[pool] budget",
                        name, FormatBytes(bytes), FormatBytes(budget));
    return plan;
  }
  uint32_t on_device = 0;
  for (const Resident& r : lru) on_device += r.where != Where::kParked && r.model != model;
  auto fits = [&](uint64_t used_now, uint32_t count_now) {
    bool by_bytes = budget == 0 || used_now + bytes <= budget;
    bool by_count = limits.capacity == 0 || count_now < limits.capacity;
    return by_bytes && by_count;
  };
  if (fits(used, on_device)) {
    plan.kind = AdmissionPlan::Kind::kAdmit;
    return plan;
  }
  // What comes back without a decision of ours (releases under way), then idle unpinned device
  // models, least recently used first.
  uint64_t after = used;
  uint32_t count_after = on_device;
  bool something_busy = false;
  std::vector<std::string> pinned;
  for (const Resident& r : lru) {
    if (r.model == model || r.where != Where::kLeaving) continue;
    after -= r.device_bytes;
    count_after--;
  }
  for (const Resident& r : lru) {
    if (fits(after, count_after)) break;
    if (r.model == model || r.where == Where::kLeaving || r.where == Where::kParked) continue;
    if (r.pinned) {
      pinned.push_back(r.name);
      continue;
    }
    if (r.where == Where::kSettling || r.busy) {
      something_busy = true;
      continue;
    }
    plan.victims.push_back(r.model);
    after -= r.device_bytes;
    count_after--;
  }
  if (fits(after, count_after) || something_busy || after != used) {
    // Enough once the victims are released; or busy models become evictable when their requests
    // finish: release what we can now and ask again when something changes.
    plan.kind = plan.victims.empty() ? AdmissionPlan::Kind::kWait : AdmissionPlan::Kind::kEvict;
    return plan;
  }
  plan.kind = AdmissionPlan::Kind::kReject;
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

bool ShouldPark(uint64_t weight_bytes, bool can_copy, uint64_t park_used, const Limits& limits) {
  return can_copy && weight_bytes > 0 && limits.park_budget_bytes != 0 &&
         park_used + weight_bytes <= limits.park_budget_bytes;
}

std::vector<uint32_t> PlanMaxCached(const std::vector<Resident>& lru, uint32_t keep,
                                    const Limits& limits) {
  std::vector<uint32_t> victims;
  if (limits.max_cached == 0) return victims;
  size_t cached = 0;
  for (const Resident& r : lru) cached += r.where != Where::kLeaving;
  for (Where kind : {Where::kParked, Where::kDevice}) {
    for (const Resident& r : lru) {
      if (cached <= limits.max_cached) return victims;
      if (r.where != kind || r.model == keep || r.pinned || r.busy) continue;
      victims.push_back(r.model);
      cached--;
    }
  }
  return victims;
}

std::vector<uint32_t> PlanExpiry(const std::vector<Resident>& lru, uint64_t now_ms) {
  std::vector<uint32_t> expired;
  if (lru.size() <= 1) return expired;
  for (size_t i = 0; i + 1 < lru.size(); i++) {  // never the most recently used (the last)
    const Resident& r = lru[i];
    if (r.where != Where::kDevice || r.expires_at_ms == 0 || now_ms < r.expires_at_ms ||
        r.busy || r.pinned) {
      continue;
    }
    expired.push_back(r.model);
  }
  return expired;
}

}  // namespace warmpool::supervisor::policy
