#include "supervisor/policy/admission.h"

#include <algorithm>
#include <optional>

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
  plan.by_count = budget == 0 || used + bytes <= budget;
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
  // It did not fit before the releases under way were counted: if it fits now, they make room.
  plan.room_coming = plan.victims.empty() && fits(after, count_after);
  plan.sufficient = fits(after, count_after);
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
  const std::string pins = pinned.empty() ? "" : ", pinned: " + names;
  // The refusal names the limit in the way: the count of models (single_active, capacity) or
  // the bytes (the budget). Raising the budget does nothing for the first.
  if (plan.by_count && limits.single_active) {
    plan.reason = Error(Code::kResourceExhausted,
                        "no room for model \"{}\": [pool] single_active keeps one model on the device{}; "
                        "unpin or unload it, or turn single_active off",
                        name, pins);
  } else if (plan.by_count) {
    plan.reason = Error(Code::kResourceExhausted,
                        "no room for model \"{}\": the device holds its [pool] capacity of {} model(s){}; "
                        "unpin or unload a model, or raise [pool] capacity",
                        name, limits.capacity, pins);
  } else {
    plan.reason = Error(Code::kResourceExhausted,
                        "no room for model \"{}\" ({}): {} of {} in use{}; unpin or unload a model, "
                        "or raise the budget (--budget or [pool] budget)",
                        name, FormatBytes(bytes), FormatBytes(used), FormatBytes(budget), pins);
  }
  return plan;
}

std::vector<Resident> OnDevice(const std::vector<Resident>& lru, uint32_t device) {
  std::vector<Resident> mine;
  for (const Resident& r : lru) {
    if (r.where == Where::kParked || r.device == device) mine.push_back(r);
  }
  return mine;
}

PlacementPlan PlanPlacement(const std::vector<Resident>& lru, uint32_t model,
                            const std::string& name, uint64_t bytes,
                            const std::vector<DeviceRoom>& devices, const Limits& limits) {
  // How recently a model was used: its position in the LRU list.
  auto position = [&](uint32_t m) {
    for (size_t i = 0; i < lru.size(); i++) {
      if (lru[i].model == m) return i;
    }
    return lru.size();
  };
  // Each candidate's rank: lower is better, then the lower key.
  struct Candidate {
    int rank = 0;
    uint64_t key = 0;
    PlacementPlan placed;
  };
  std::optional<Candidate> best;
  const DeviceRoom* widest = nullptr;
  AdmissionPlan widest_reject;
  for (const DeviceRoom& d : devices) {
    if (!d.can_load) continue;
    Limits own = limits;
    own.budget_bytes = d.budget;
    AdmissionPlan plan = PlanAdmission(OnDevice(lru, d.device), model, name, bytes, d.used, own);
    Candidate c;
    switch (plan.kind) {
      case AdmissionPlan::Kind::kAdmit:
        // The most room left after (unlimited: the least used). With a worker starting it waits
        // for it: better than evicting elsewhere, worse than loading now elsewhere. With none
        // coming soon, an eviction elsewhere goes first.
        c.rank = d.up ? 0 : d.coming ? 1 : 3;
        c.key = d.budget == 0 ? d.used : UINT64_MAX - (d.budget - d.used - bytes);
        break;
      case AdmissionPlan::Kind::kWait:
        c.rank = plan.room_coming ? 1 : 3;
        break;
      case AdmissionPlan::Kind::kEvict: {
        c.rank = plan.sufficient ? 2 : 4;  // then the victims whose most recent use is oldest
        size_t newest = 0;
        for (uint32_t v : plan.victims) newest = std::max(newest, position(v));
        c.key = newest;
        break;
      }
      case AdmissionPlan::Kind::kReject:
        if (widest == nullptr || (widest->budget != 0 && (d.budget == 0 || d.budget > widest->budget))) {
          widest = &d;
          widest_reject = plan;
        }
        continue;
    }
    c.placed = PlacementPlan{d.device, std::move(plan)};
    if (!best || c.rank < best->rank || (c.rank == best->rank && c.key < best->key)) best = std::move(c);
  }
  if (best) return std::move(best->placed);
  PlacementPlan none;
  if (widest != nullptr) {
    none.plan = std::move(widest_reject);
  } else {
    none.plan.kind = AdmissionPlan::Kind::kWait;  // no device can load now
  }
  return none;
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
  for (size_t i = 0; i < lru.size(); i++) {
    const Resident& r = lru[i];
    if (r.where != Where::kDevice || r.expires_at_ms == 0 || now_ms < r.expires_at_ms ||
        r.busy || r.pinned) {
      continue;
    }
    const bool last_warm = lru.size() <= 1 || i + 1 == lru.size();  // the only one, or the MRU
    if (last_warm && !r.release_when_idle) continue;
    expired.push_back(r.model);
  }
  return expired;
}

}  // namespace warmpool::supervisor::policy
