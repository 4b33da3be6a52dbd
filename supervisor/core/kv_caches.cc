// A language model's KV cache outlives the worker that wrote it (engine ABI version 10): each
// replica's engine keeps its sequences' keys and values in a region that came to the supervisor
// with its load (WorkerLoadDone.cache_shared), with records saying which tokens' positions each
// block holds (engines/transformer/kv_region.h). When the worker dies, the generations retried from
// it — a stream resumed after the tokens its client has, or one that had sent nothing yet — take
// that region along (WorkerInfer.kv_source), and whichever worker runs them copies the positions
// it finds there instead of computing the prompt and the tokens sent again.
//
// What the core holds: a replica's region while its worker serves the model (replica_caches_), and a
// dead replica's while a retried generation names it (kv_sources_): until that generation's first
// chunk, when its engine has read it, or until its model holds no weights (a dead cache is kept
// only while its streams are about to go on: in host memory it is memory no budget counts; a GPU's
// pool counts against its device's room with its model, and is kept only where that room is).
// Both are reconciled after every event (ForgetKvCaches), so no
// path that ends a replica or a job — an unload, a release, a move, a deadline, a client that left
// — needs to know about them.
//
// A cache whose engine closed cleanly is another matter (engine ABI version 11): when a model parks,
// the first replica whose unload comes back leaves its cache to the parked copy (KeepCacheToPark,
// into residency::Releasing and then Parked, whose transitions own it from there), and the worker
// that unparks the model adopts it, prefix cache and all.
#include <algorithm>

#include "supervisor/core/core.h"

namespace warmpool::supervisor {

void Core::KeepReplicaCache(uint32_t model, uint32_t worker, KeptKvCache cache) {
  if (cache.handle < 0) return;
  // A reply that made no replica (a failure, a stale load) leaves nothing to hold it for.
  if (!AttachedReplica(model, worker) || replica_caches_.contains({model, worker})) return Close(cache.handle);
  replica_caches_[{model, worker}] = cache;
}

void Core::KeepCacheToPark(uint32_t model, uint32_t worker) {
  residency::Releasing* r = models_[model].machine.As<residency::Releasing>();
  // Parking: its copy on its way or made (a park that failed keeps nothing), and no cache kept yet
  // (one replica's is enough: they were all of the same weights, and the first to close cleanly
  // goes first).
  if (r == nullptr || r->kv_cache.handle >= 0 || (r->park_job == 0 && !r->copy) || r->then_failed) return;
  // Handing over to a daemon that takes over, nothing is kept that it cannot have (see StartUnpark).
  if (handing_over_) return;
  auto it = replica_caches_.find({model, worker});
  if (it == replica_caches_.end() || it->second.bytes == 0) return;
  // A GPU's cache is device memory: kept, it would hold the device a park is to free. Its host copy,
  // which the park sent, is kept instead (OnParkDone).
  if (it->second.on_device) return;  // let go (ForgetKvCaches)
  // Within the park budget, with the copies parked or parking (which count this model's copy).
  if (ParkCommitted() + it->second.bytes > config_.park_budget_bytes) return;  // let go (ForgetKvCaches)
  r->kv_cache = it->second;
  replica_caches_.erase(it);
}

void Core::HandCachesToRetries(uint32_t slot, std::vector<std::pair<uint32_t, Waiter>>& retries) {
  for (auto it = replica_caches_.begin(); it != replica_caches_.end();) {
    const auto [model, worker] = it->first;
    if (worker != slot) {
      ++it;
      continue;
    }
    // A GPU's pool is device memory: held, it takes room beside the replica that replaces it (a
    // worker respawned attaches at once, as admitted before). Kept only where the device has that
    // room beside all it holds; else let go, and the retried generations compute their prompts.
    const uint32_t device = models_[model].machine.Device();
    const uint64_t budget = device == shm::kNil ? 0 : index_->DeviceBudget(device);
    if (it->second.on_device && budget != 0) {
      uint64_t held = it->second.bytes;
      for (const policy::Resident& r : Residents()) {
        if (r.device == device && r.where != policy::Resident::Where::kParked) held += r.device_bytes;
      }
      if (held > budget) {
        Close(it->second.handle);
        it = replica_caches_.erase(it);
        continue;
      }
    }
    bool named = false;
    for (auto& [retried, waiter] : retries) {
      // One still holding an earlier dead replica's cache, unread, keeps it: this one may have
      // died before it copied anything from there.
      if (retried != model || !waiter.generate || waiter.kv_source >= 0) continue;
      waiter.kv_source = it->second.handle;
      named = true;
    }
    if (named) kv_sources_.emplace(it->second.handle, KvSource{it->second.bytes, it->second.on_device, model});
    else Close(it->second.handle);
    it = replica_caches_.erase(it);
  }
}

uint64_t Core::DeviceKvSourceBytes(uint32_t model) const {
  uint64_t bytes = 0;
  for (const auto& [handle, source] : kv_sources_) {
    if (source.on_device && source.model == model) bytes += source.bytes;
  }
  return bytes;
}

void Core::NoteKvUsage(uint32_t model, uint32_t worker, const v1::KvUsage& usage) {
  if (usage.blocks() == 0) return;  // nothing said
  kv_usage_[{model, worker}] = {std::min(usage.blocks_held(), usage.blocks()), usage.blocks(),
                                 std::min(usage.blocks_reserved(), usage.blocks())};
}

bool Core::AttachedReplica(uint32_t model, uint32_t worker) const {
  // A replica attaching again (an unload and a new attach on the same worker in one event) has not
  // said anything of its own yet: what is kept under its key is its predecessor's.
  const std::vector<Replica>* replicas = models_[model].machine.Replicas();
  return replicas != nullptr && std::any_of(replicas->begin(), replicas->end(), [&](const Replica& r) {
           return r.worker == worker && r.attach_job == 0;
         });
}

void Core::ForgetKvCaches() {
  prefix_homes_.ForgetUnless([&](uint32_t model, uint32_t worker) { return AttachedReplica(model, worker); });
  for (auto it = kv_usage_.begin(); it != kv_usage_.end();) {
    it = AttachedReplica(it->first.first, it->first.second) ? std::next(it) : kv_usage_.erase(it);
  }
  for (auto it = replica_caches_.begin(); it != replica_caches_.end();) {
    if (AttachedReplica(it->first.first, it->first.second) && it->second.handle >= 0) {
      ++it;
      continue;
    }
    Close(it->second.handle);
    it = replica_caches_.erase(it);
  }
  if (kv_sources_.empty()) return;
  std::set<int> named;
  for (const auto& [id, job] : jobs_) named.insert(job.kv_source);
  for (Model& m : models_) {
    // A model that holds no weights now (released, parked, unloaded, loading again) lets its
    // waiters' sources go: a dead cache is held only while its stream is about to go on.
    const bool weights_held = m.machine.DeviceWeights() != nullptr;
    for (Waiter& w : m.waiters) {
      if (!weights_held) w.kv_source = -1;
      named.insert(w.kv_source);
    }
  }
  for (auto it = kv_sources_.begin(); it != kv_sources_.end();) {
    if (named.contains(it->first)) {
      ++it;
      continue;
    }
    Close(it->first);
    it = kv_sources_.erase(it);
  }
}

}  // namespace warmpool::supervisor
