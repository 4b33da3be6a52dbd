// Weights a supervisor before this one held (supervisor/core/kept.h): what the shell keeps across
// a restart (Kept) and what the next core takes back (Adopt).
//
// A kept handle is adopted only when the registry still describes the very bytes it holds: the
// same model, engine and path, and the same version of the file (size, modification time, inode,
// header). A file deleted since is no contradiction: the weights kept are the last version there
// was, which the daemon before was serving. Anything else is closed and logged.
//
// Budgets and limits may have changed across the restart: adoption fills the devices most
// recently used first, as far as the budget, capacity, single_active and max_cached allow; what no
// longer fits is parked where the park budget has room (host backend: device weights are host
// memory already, so the region itself becomes the parked copy) and dropped otherwise (cuda
// device memory). The LRU order is the one the models had.
#include <algorithm>

#include "common/units.h"
#include "supervisor/core/core.h"

namespace warmpool::supervisor {

using namespace residency;

bool Core::KeepsDeviceWeights() const {
  // Host memory is a memfd of its own. Device memory on cuda belongs to the owner process, which
  // exits with the supervisor: kept only where the operator says allocations outlive it, and only
  // when shared by descriptor (a legacy IPC handle names memory in the dead owner).
  return config_.backend != Backend::kCuda || (config_.cuda_keep_across_restarts && config_.cuda_sharing == "vmm");
}

void Core::StoreKeptWhenDue(bool now) {
  // The segment counts every batch of changes: with none since the last look, nothing changed.
  const uint64_t changes = segment_.header().changes;
  const uint64_t ms = MonoMs();
  if (kept_stored_once_ && (changes == kept_looked_changes_ || (!now && ms - kept_looked_ms_ < kKeptSyncMs))) {
    return;
  }
  kept_looked_ms_ = ms;
  std::vector<KeptWeights> kept = Kept();
  std::vector<std::tuple<int, bool, std::string>> said;
  for (const KeptWeights& k : kept) said.emplace_back(k.weights.handle, k.parked, k.name);
  if (kept_stored_once_ && said == kept_stored_) {
    kept_looked_changes_ = changes;
    return;
  }
  std::vector<std::tuple<int, bool, std::string>> members = said, before = kept_stored_;
  std::sort(members.begin(), members.end());
  std::sort(before.begin(), before.end());
  // Only the order moved: looked at again at the next tick until kKeptOrderOnlyMs have passed.
  if (kept_stored_once_ && !now && members == before && ms - kept_stored_ms_ < kKeptOrderOnlyMs) return;
  kept_looked_changes_ = changes;
  kept_stored_ = std::move(said);
  kept_stored_once_ = true;
  kept_stored_ms_ = ms;
  actions_.push_back(action::StoreKept{std::move(kept)});
}

std::vector<KeptWeights> Core::Kept() const {
  std::vector<KeptWeights> kept;
  const bool device_weights = KeepsDeviceWeights();
  for (uint32_t model : index_->LruOrder()) {
    const Model& m = models_[model];
    if (m.changing()) continue;  // a new version replaces it: not worth keeping
    // The version the weights were read from, not the registration's (which is empty for a file
    // deleted since: the weights are then all there is of it, and a later restart must still know
    // what they are).
    KeptWeights k{m.entry.name, m.entry.engine, m.entry.path, false, {}};
    if (const Parked* p = m.machine.As<Parked>()) {
      k.parked = true;
      k.weights = p->copy;
    } else if (const Unparking* u = m.machine.As<Unparking>()) {
      k.parked = true;  // the copy stays what it was until the device has it
      k.weights = u->copy;
    } else if (const Weights* w = m.machine.DeviceWeights(); w != nullptr && device_weights) {
      k.weights = *w;  // ready or releasing: the region is intact until it is closed
    } else {
      continue;
    }
    if (k.weights.handle < 0) continue;
    kept.push_back(k);
    if (const Parked* p = m.machine.As<Parked>(); p != nullptr && p->kv_cache.handle >= 0) {
      k.kv_cache = true;
      k.weights.handle = p->kv_cache.handle;
      k.weights.weight_bytes = p->kv_cache.bytes;
      kept.push_back(std::move(k));
    }
  }
  return kept;
}

Status Core::CheckKept(const KeptWeights& k) const {
  const uint32_t model = index_->Find(k.name);
  if (model == shm::kNil) return Error(Code::kNotFound, "it is not in the registry any more");
  const Model& m = models_[model];
  // A deleted file's registration keeps the path as configured, which need not be the real path
  // the weights were loaded from (a symlink, a relative path): the engine must still agree.
  const bool path_differs = m.entry.path != k.path && !m.entry.file_missing;
  if (m.entry.engine != k.engine || path_differs) {
    return Error(Code::kFailedPrecondition, "it is registered as engine \"{}\" at {} now, not \"{}\" at {}",
                 m.entry.engine, m.entry.path, k.engine, k.path);
  }
  if (!m.machine.Is<Absent>() && !m.machine.Is<Failed>()) {
    return Error(Code::kFailedPrecondition, "it was kept twice");
  }
  // A file deleted since is no contradiction (the weights kept are all there is of it); a path
  // refused for any other reason is.
  if (!m.refused.ok() && !m.entry.file_missing) return m.refused;
  if (k.weights.handle < 0 || k.weights.header.empty()) {
    return Error(Code::kInvalidArgument, "the record kept describes no weights");
  }
  if (!k.parked && (k.weights.device >= DeviceCount() || !KeepsDeviceWeights())) {
    return Error(Code::kFailedPrecondition, "its device memory cannot be adopted here");
  }
  if (m.entry.problem.ok()) {
    if (k.weights.version == FileVersion{} || k.weights.version != m.entry.version || k.weights.header != m.entry.header ||
        k.weights.file_size != m.entry.file_size) {
      return Error(Code::kFailedPrecondition, "its file changed since it was loaded");
    }
    return OkStatus();
  }
  if (m.entry.file_missing) return OkStatus();  // deleted since: the weights kept are all there is
  return Error(Code::kFailedPrecondition, "it is registered as failed: {}", m.entry.problem.message());
}

void Core::Adopt(std::vector<KeptWeights> kept) {
  // KV caches go to the parked copies adopted, once those are.
  std::vector<KeptWeights> caches;
  for (auto it = kept.begin(); it != kept.end();) {
    if (!it->kv_cache) {
      ++it;
      continue;
    }
    caches.push_back(std::move(*it));
    it = kept.erase(it);
  }
  AdoptWeights(std::move(kept));
  for (KeptWeights& k : caches) AdoptKvCache(k);
}

void Core::AdoptKvCache(const KeptWeights& k) {
  const uint32_t model = index_->Find(k.name);
  Parked* p = model != shm::kNil ? models_[model].machine.As<Parked>() : nullptr;
  std::string why;
  if (p == nullptr) why = "its model was not adopted parked";
  else if (p->kv_cache.handle >= 0) why = "it was kept twice";
  else if (p->copy.version != k.weights.version || p->copy.header != k.weights.header) why = "it is of other weights";
  else if (config_.park_budget_bytes < index_->ParkUsed() + k.weights.weight_bytes) why = "no room in the park budget";
  if (!why.empty()) {
    Log(LogLevel::kInfo, "not adopting the KV cache kept of \"{}\": {}; closed", k.name, why);
    return Close(k.weights.handle);
  }
  models_[model].machine.KeepKvCache(KeptKvCache{k.weights.handle, k.weights.weight_bytes});
  Log(LogLevel::kInfo, "adopted the KV cache of \"{}\" ({}) with its parked copy", k.name,
      FormatBytes(k.weights.weight_bytes));
}

void Core::AdoptWeights(std::vector<KeptWeights> kept) {
  // Checked first, in the order kept (least recently used first); duplicates are refused by
  // marking each accepted name as it goes.
  std::vector<KeptWeights> accepted;
  std::vector<bool> seen(models_.size(), false);
  for (KeptWeights& k : kept) {
    Status ok = CheckKept(k);
    const uint32_t model = index_->Find(k.name);
    if (ok.ok() && seen[model]) ok = Error(Code::kFailedPrecondition, "it was kept twice");
    if (!ok.ok()) {
      Log(LogLevel::kWarn, "not adopting the weights kept of \"{}\": {}; closed", k.name, ok.message());
      Close(k.weights.handle);
      continue;
    }
    seen[model] = true;
    accepted.push_back(std::move(k));
  }
  // Room, most recently used first: the budgets of this configuration, which may differ from the
  // one the weights were kept under.
  const policy::Limits limits = Limits();
  std::vector<uint64_t> device_used(DeviceCount(), 0);
  std::vector<uint32_t> device_models(DeviceCount(), 0);
  uint64_t park_used = 0;
  uint32_t cached = 0;
  std::vector<bool> keep(accepted.size(), true);
  for (size_t i = accepted.size(); i-- > 0;) {
    KeptWeights& k = accepted[i];
    const uint64_t bytes = k.weights.weight_bytes;
    const bool count_ok = limits.max_cached == 0 || cached < limits.max_cached;
    if (!k.parked) {
      const uint32_t d = k.weights.device;
      const uint64_t need = bytes + k.weights.workspace_bytes;
      const bool fits = count_ok && (Budget(d) == 0 || device_used[d] + need <= Budget(d)) &&
                        (limits.capacity == 0 || device_models[d] < limits.capacity) &&
                        (!config_.single_active || device_models[d] == 0);
      if (fits) {
        device_used[d] += need;
        device_models[d]++;
        cached++;
        continue;
      }
      if (config_.backend != Backend::kCuda) {
        k.parked = true;  // host memory already: it can stay as the parked copy
        Log(LogLevel::kInfo, "\"{}\" no longer fits on device {} under this configuration: parking it", k.name, d);
      }
    }
    if (!k.parked) {
      // Device memory that does not fit: a copy to host memory would need a worker to make it.
      Log(LogLevel::kInfo, "dropping the weights kept of \"{}\": no room on device {} under this configuration",
          k.name, k.weights.device);
      Close(k.weights.handle);  // a daemon before this one kept it: not reused here
      keep[i] = false;
      continue;
    }
    if (count_ok && limits.park_budget_bytes != 0 && park_used + bytes <= limits.park_budget_bytes) {
      park_used += bytes;
      cached++;
      continue;
    }
    Log(LogLevel::kInfo, "dropping the weights kept of \"{}\": no room for them under this configuration",
        k.name);
    Close(k.weights.handle);
    keep[i] = false;
  }
  // Least recently used first: each adoption links its record at the most recent end.
  for (size_t i = 0; i < accepted.size(); i++) {
    if (!keep[i]) continue;
    KeptWeights& k = accepted[i];
    const uint32_t model = index_->Find(k.name);
    Model& m = models_[model];
    m.last_error.clear();
    const bool parked = k.parked;
    const std::string what = parked ? fmt::format("parked ({})", FormatBytes(k.weights.weight_bytes))
                                    : fmt::format("ready ({})", FormatBytes(k.weights.weight_bytes));
    if (m.entry.file_missing) {
      Log(LogLevel::kWarn, "\"{}\": its file {} is gone; serving the weights kept", k.name, k.path);
    }
    // Memory a daemon before this one kept: never reused here (its workers may still map it).
    if (k.weights.handle >= 0) adopted_memory_.insert(k.weights.handle);
    m.machine.Adopt(std::move(k.weights), parked);
    // Adopted weights keep the model's keep_alive, counted from now as if a request had just
    // ended: without it they would stay on the device until evicted.
    if (!parked) {
      m.entry.workspace_bytes = m.machine.DeviceWeights()->workspace_bytes;
      m.entry.sequences = m.machine.DeviceWeights()->sequences;
      m.entry.kv_tokens = m.machine.DeviceWeights()->kv_tokens;
      // The engine's bytes a position go with its counts, as a load report's do (Core::OnLoadDone).
      if (m.machine.DeviceWeights()->kv_bytes_per_token != 0) {
        m.entry.kv_bytes_per_token = m.machine.DeviceWeights()->kv_bytes_per_token;
      }
      StartKeepAlive(model);
    }
    Log(LogLevel::kInfo, "adopted \"{}\" {}, kept across the restart", m.entry.name, what);
    adopted_++;
  }
}

}  // namespace warmpool::supervisor
